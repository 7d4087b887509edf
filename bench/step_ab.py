"""bertjax's CPU train step in several variants, compiled in ONE process and called in turn.

On a shared, noisy machine two processes run minutes apart see different loads; here every
variant's step is built and compiled first, then the variants are called alternately (A B C,
C B A, ...) for ``--rounds`` rounds, so drift in the machine's load hits them alike. Prints per
variant the median and min step seconds and the median process CPU seconds (all threads) per
step, each as a ratio to the first variant.

    python bench/step_ab.py --workload=W1 --rounds=12 jit plainforms nogemm nogemv
    python bench/step_ab.py --workload=W2 jit fulllast

Variants are ``bench/step_bertjax.py``'s (``jit``: as ``python -m bertjax.main`` runs; ``fulllast``;
``plainforms``: ``cpu_forms=False``, the plain dot_general projections and ``+`` vocab bias), and
two that drop one CPU form each while the step is traced: ``nogemm`` (projections as
``dot_general``) and ``nogemv`` (the vocab bias gradient as XLA's column reduction). Needs the
peers harness (``../shared/bench/peers``, or PEERS) for the workloads and batches.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
PEERS = pathlib.Path(os.environ.get("PEERS", REPO.parent / "shared" / "bench" / "peers"))
sys.path[:0] = [str(REPO / "bench"), str(PEERS)]

import common  # noqa: E402  (the peers harness)
import step_bertjax  # noqa: E402  (bench/, beside this script)

from bertjax.model import cpu_forms  # noqa: E402


def _build(workload: dict, variant: str):
    """The variant's step, compiled (its first call) with its CPU form dropped, if any."""
    dense_dot, add_vocab_bias = cpu_forms.dense_dot, cpu_forms.add_vocab_bias
    if variant == "nogemm":
        cpu_forms.dense_dot = lambda x, kernel, dims, flat: dense_dot(x, kernel, dims, False)
    if variant == "nogemv":
        cpu_forms.add_vocab_bias = lambda logits, bias: logits + bias
    try:
        step = step_bertjax.build_step(workload, "jit" if variant.startswith("no") else variant)
        step()
    finally:
        cpu_forms.dense_dot, cpu_forms.add_vocab_bias = dense_dot, add_vocab_bias
    return step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="W1")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("variants", nargs="+")
    args = parser.parse_args()
    workload = common.load_workload(args.workload)
    steps = {v: _build(workload, v) for v in args.variants}
    for step in steps.values():
        step()  # one warm step each
    seconds = {v: [] for v in steps}
    cpu = {v: [] for v in steps}
    for r in range(args.rounds):
        for v in args.variants if r % 2 == 0 else args.variants[::-1]:
            cpu_start, start = time.process_time(), time.perf_counter()
            steps[v]()
            seconds[v].append(time.perf_counter() - start)
            cpu[v].append(time.process_time() - cpu_start)
    base = args.variants[0]
    median = {v: statistics.median(seconds[v]) for v in steps}
    low = {v: min(seconds[v]) for v in steps}
    cpu_median = {v: statistics.median(cpu[v]) for v in steps}
    print(f"{args.workload}: {args.rounds} rounds, load {os.getloadavg()[0]:.1f} at the end")
    print(f"| variant | step s median (min) | CPU s median | / {base}: median, min, CPU |")
    print("| --- | --- | --- | --- |")
    for v in args.variants:
        print(
            f"| {v} | {median[v]:.3f} ({low[v]:.3f}) | {cpu_median[v]:.3f} | "
            f"{median[v] / median[base]:.3f}, {low[v] / low[base]:.3f}, "
            f"{cpu_median[v] / cpu_median[base]:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
