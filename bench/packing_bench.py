"""The whole ``python -m bertjax.main`` run, packed against unpacked, side by side (issue 26).

Each round runs the same command twice, ``data.pack_sequences`` False then True (the order
alternates between rounds), each in a fresh workdir, and reads the run's ``final summary``: the
last log window's instances and real tokens per second (``seq/s`` and ``tok/s``, which count what
was learned from, not the slots computed) and its instances per step. With packing the config's
``train.global_batch_size`` counts instances, so both runs train on the same number of instances
per step on average (``bertjax.pretrain.inputs.resolve_packed_batch``) and differ in the rows
they compute. The instance table is built once, before the first timed run, in
``--cache_dir``.

    python bench/packing_bench.py --rounds=3 -- --config.data.input_files=/tmp/wiki_like.txt.gz \
        --config.data.max_seq_length=512 --config.data.max_predictions_per_seq=80

Arguments after ``--`` go to every run (on top of ``configs/tiny.py`` and the flags below).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(extra: list[str], packed: bool, cache_dir: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as workdir:
        command = [
            sys.executable, "-m", "bertjax.main", "--config=configs/tiny.py",
            f"--workdir={workdir}", f"--config.train.num_steps={steps}",
            f"--config.train.log_every={steps // 2}", "--config.train.eval_every=0",
            f"--config.checkpoint.every_steps={steps}", f"--config.data.cache_dir={cache_dir}",
            f"--config.data.pack_sequences={packed}", *extra,
        ]  # fmt: skip
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
    line = next(x for x in result.stdout.splitlines() if x.startswith("final summary: "))
    train = json.loads(line.removeprefix("final summary: "))["train"]
    rows = next((x for x in result.stdout.splitlines() if x.startswith("packing: ")), "")
    return {**train, "packing_line": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60, help="per run; the last half is timed")
    parser.add_argument("--cache_dir", default=os.path.join(tempfile.gettempdir(), "packbench"))
    parser.add_argument("rest", nargs="*", help="after --: flags for every run")
    args = parser.parse_args()
    run(args.rest, True, args.cache_dir, 2)  # builds and caches the instance table
    results = {False: [], True: []}
    for r in range(args.rounds):
        for packed in (False, True) if r % 2 == 0 else (True, False):
            results[packed].append(run(args.rest, packed, args.cache_dir, args.steps))
            print(f"round {r} packed={packed}: {results[packed][-1]['tokens_per_sec']:.0f} tok/s",
                  flush=True)  # fmt: skip
    print(results[True][0]["packing_line"])
    print("| form | instances/step | seq/s (instances) | tok/s (real) | ratio of tok/s |")
    print("| --- | --- | --- | --- | --- |")
    base = statistics.median(x["tokens_per_sec"] for x in results[False])
    for packed in (False, True):
        rows = results[packed]
        tok = [x["tokens_per_sec"] for x in rows]
        seq = [x["sequences_per_sec"] for x in rows]
        inst = statistics.median(x["instances_per_step"] for x in rows)
        print(f"| {'packed' if packed else 'unpacked'} | {inst:.1f} | "
              f"{statistics.median(seq):.1f} ({min(seq):.1f}-{max(seq):.1f}) | "
              f"{statistics.median(tok):.0f} ({min(tok):.0f}-{max(tok):.0f}) | "
              f"{statistics.median(tok) / base:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
