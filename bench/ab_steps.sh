#!/usr/bin/env bash
# bertjax's CPU train step at two git revisions, run alternately on the peers' workloads (an A/B
# that shows whether a change made the CPU path slower).
#
#   bash bench/ab_steps.sh BASE                # BASE (a commit) against the working tree
#   ROUNDS=3 WORKLOADS="W1" bash bench/ab_steps.sh 33c3918
#
# BASE is extracted with `git archive` into a scratch dir (SCRATCH, default a fresh mktemp dir);
# each run is `bench/step_bertjax.py --variant ${VARIANT:-jit}` of that tree with the tree first on
# PYTHONPATH, so each revision runs its own runner and its own package. Within a round the order
# alternates (base, new / new, base) to cancel drift. Prints median step seconds per workload
# and new / base; the JSON lines stay in SCRATCH/results_{base,new}.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: ab_steps.sh BASE_COMMIT" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)
peers=${PEERS:-$repo/../shared/bench/peers}
[ -f "$peers/common.py" ] || { echo "ab_steps.sh: no peers harness at $peers (set PEERS)" >&2; exit 2; }
scratch=${SCRATCH:-$(mktemp -d "${TMPDIR:-/tmp}/bertjax-ab.XXXXXX")}
mkdir -p "$scratch/base" "$scratch/harness"
cp -r "$peers"/. "$scratch/harness"/
chmod -R u+w "$scratch/harness"
git -C "$repo" archive "$1" | tar -x -C "$scratch/base"
py=${PY:-$(command -v python3)}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
run() {  # label tree workload
  local out="$scratch/results_$1"
  mkdir -p "$out"
  printf '%s  load=%s  %s %s\n' "$(date +%T)" "$(cut -d' ' -f1 /proc/loadavg)" "$1" "$3"
  (cd "$scratch/harness" && BENCH_RESULTS="$out" PYTHONPATH="$2:$scratch/harness" \
    "$py" "$2/bench/step_bertjax.py" --workload "$3" --variant "${VARIANT:-jit}" \
    >>"$out/log.txt" 2>&1) || echo "    failed: see $out/log.txt"
}
for round in $(seq 1 "${ROUNDS:-2}"); do
  for wl in ${WORKLOADS:-W1 W2 W3}; do
    if [ $((round % 2)) = 1 ]; then run base "$scratch/base" "$wl"; run new "$repo" "$wl"
    else run new "$repo" "$wl"; run base "$scratch/base" "$wl"; fi
  done
done
"$py" - "$scratch" "$1" <<'EOF'
import json, pathlib, statistics, sys
scratch, base = pathlib.Path(sys.argv[1]), sys.argv[2]
runs = {}
for label in ("base", "new"):
    for line in (scratch / f"results_{label}" / "steps.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "step_s_median" in r:
            runs.setdefault((r["workload"], label), []).append(r["step_s_median"])
print(f"| workload | {base}: step s (runs) | working tree: step s (runs) | new / base |")
print("| --- | --- | --- | --- |")
for wl in sorted({w for w, _ in runs}):
    b, n = runs.get((wl, "base"), []), runs.get((wl, "new"), [])
    cell = lambda xs: f"{statistics.median(xs):.3f} ({', '.join(f'{x:.3f}' for x in xs)})"
    ratio = f"{statistics.median(n) / statistics.median(b):.3f}" if b and n else "?"
    print(f"| {wl} | {cell(b) if b else '-'} | {cell(n) if n else '-'} | {ratio} |")
print(f"results in {scratch}")
EOF
