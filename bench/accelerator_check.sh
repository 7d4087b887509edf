#!/usr/bin/env bash
# The one command for the day a GPU or TPU is lent: the attention kernel self-check, the kernels'
# equality tests on the device, the train step ('fused', 'xla', HF Flax) at BERT-base 128 and
# BERT-large 512 with MFU, and configs/tiny.py's losses beside a CPU run's; everything goes to
# bench/results/ (bench/accelerator_check.py's docstring has the sections).
#
#   bash bench/accelerator_check.sh                  # on the lent machine
#   bash bench/accelerator_check.sh --tiny --out /tmp/check   # CPU smoke mode: not timings
#
# PY picks the interpreter (default python3, bertjax installed); PEERS the peers harness
# (default ../shared/bench/peers beside the repository).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
exec "${PY:-python3}" "$repo/bench/accelerator_check.py" "$@"
