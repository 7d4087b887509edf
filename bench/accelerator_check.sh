#!/usr/bin/env bash
# The one command for the day a GPU or TPU is lent: the attention kernel self-check and the
# kernels' equality tests on the device, then the train step (the peers' fp32 contract beside HF
# Flax; configs/bert_base.py in bf16 as it ships, rows padded and packed) with MFU, one process
# per framework; it prints its device-time estimate first and writes its results after every
# section (bench/accelerator_check.py's docstring; docs/benchmarks.md, "The day an accelerator
# is lent").
#
#   bash bench/accelerator_check.sh --out "$OUT" --timeout 420    # on the lent machine
#   bash bench/accelerator_check.sh --estimate_only               # the estimate, nothing run
#   bash bench/accelerator_check.sh --tiny --out /tmp/check --peak_flops=1e12   # CPU smoke mode
#
# PY picks the interpreter (default python3, bertjax's dependencies installed); PEERS the peers
# harness (default ../shared/bench/peers beside the repository).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
exec "${PY:-python3}" "$repo/bench/accelerator_check.py" "$@"
