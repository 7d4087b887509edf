#!/usr/bin/env bash
# bertjax's train step beside the peers (HF Flax jit, HF PyTorch eager/compiled), one run.
#
#   bash bench/run_steps.sh                          # W1 W2 W3, every peer variant
#   WORKLOADS=W2 SKIP_VARIANTS=compile bash bench/run_steps.sh
#   PASSES=2 bash bench/run_steps.sh                 # best of two passes per row (noisy host)
#
# Copies the read-only peers harness (PEERS, default ../shared/bench/peers next to the repo) to a
# scratch dir (SCRATCH, default a fresh mktemp dir), drops bench/step_bertjax.py in, and runs
# its run_all.sh with ONLY=steps. Every interpreter defaults to this python3 (bertjax installed
# editable, torch 2.13.0, transformers 4.57.6, flax). Prints the table; results stay in SCRATCH.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
peers=${PEERS:-$repo/../shared/bench/peers}
[ -f "$peers/run_all.sh" ] || { echo "run_steps.sh: no peers harness at $peers (set PEERS)" >&2; exit 2; }
scratch=${SCRATCH:-$(mktemp -d "${TMPDIR:-/tmp}/bertjax-steps.XXXXXX")}
mkdir -p "$scratch"
cp -r "$peers"/. "$scratch"/
chmod -R u+w "$scratch"
cp "$repo/bench/step_bertjax.py" "$scratch/step_bertjax.py"
py=${PY:-$(command -v python3)}
export PEER_PY=${PEER_PY:-$py} STACK_PY=${STACK_PY:-$py} BERTJAX_PY=${BERTJAX_PY:-$py}
export WORKLOADS=${WORKLOADS:-"W1 W2 W3"} ONLY=steps
export STEPS=${STEPS:-"step_flax.py step_bertjax.py step_torch.py"}
cd "$scratch"
dirs=""
for pass in $(seq 1 "${PASSES:-1}"); do
  BENCH_RESULTS="results_pass$pass" bash run_all.sh >/dev/null
  dirs="${dirs:+$dirs,}results_pass$pass"
done
python3 table.py --results "$dirs" "$@"
echo "results in $scratch"
