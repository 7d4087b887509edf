"""The tiny ModernBERT against the tiny BERT on CPU at equal compute (issue #39 item 7).

    python -m bench.modern_tiny_cpu --out_dir=/tmp/modern_tiny [--bert_steps=1000]

Runs ``python -m bertjax.main`` with ``configs/tiny.py`` (BERT: MLM at 15% + NSP, unpacked rows)
for ``--bert_steps`` steps and with ``configs/modernbert_tiny.py`` (ModernBERT's recipe: MLM at
30%, no NSP, packed rows, StableAdamW with a 1-sqrt cooldown) for as many steps as give the same
train FLOPs (bertjax's own count, ``bertjax.training.metrics.train_flops_per_sequence``, per row
times the batch), both on the bundled corpus and vocab. Each is scored by its held-out MLM
accuracy on the bundled eval split (its own masking: the eval batches its run evaluated) against
that split's unigram baseline: the share of the most frequent token among the same masked
positions, what always answering it would score. Prints a Markdown table and writes
``OUT/results.json``; the runs' logs are ``OUT/<name>.log``.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import itertools
import json
import math
import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = {"bert": "configs/tiny.py", "modernbert": "configs/modernbert_tiny.py"}


def _config(path: str):
    spec = importlib.util.spec_from_file_location("cfg", REPO / path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(REPO / "configs"))
    spec.loader.exec_module(module)
    return module.get_config()


def step_flops(config) -> float:
    """Train FLOPs of one step (every row of the global batch), bertjax's count."""
    from bertjax.pretrain import objective
    from bertjax.training import metrics

    bert_config = objective.bert_config_from(config)
    length = int(config.data.max_seq_length)
    per_row = metrics.train_flops_per_sequence(
        bert_config, length, int(config.data.max_predictions_per_seq)
    )
    return per_row * int(config.train.global_batch_size)


def unigram_baseline(config) -> dict:
    """The eval batches a run of ``config`` evaluates (its seed, batch and eval_steps): masked
    positions, and the share of the most frequent token among them."""
    from bertjax.data import pipeline

    dataset = pipeline.create_pretrain_dataset(
        config.data, batch_size=int(config.train.eval_batch_size), seed=int(config.seed),
        process_index=0, process_count=1, split="eval",
    )  # fmt: skip
    counts: collections.Counter = collections.Counter()
    batches = pipeline.numpy_batches(dataset, config.data, "eval")
    for batch in itertools.islice(batches, int(config.train.eval_steps)):
        weights = batch["masked_lm_weights"] > 0
        counts.update(batch["masked_lm_ids"][weights].tolist())
    total = sum(counts.values())
    token, top = counts.most_common(1)[0]
    return {"masked": total, "most_frequent_id": int(token), "share": top / total}


def run(name: str, out_dir: str, steps: int) -> dict:
    workdir = os.path.join(out_dir, name)
    command = [sys.executable, "-m", "bertjax.main", f"--config={CONFIGS[name]}",
               f"--workdir={workdir}", f"--config.train.num_steps={steps}"]  # fmt: skip
    if name == "modernbert":  # evaluate at the same fractions of the run as tiny.py
        command += [f"--config.train.eval_every={max(steps // 4, 1)}"]
        # The budget counts full batches (step_flops): compare at a constant batch, without the
        # shipped batch-size warm-up, whose smaller first batches the count would overstate.
        command += ["--config.train.batch_warmup_tokens=0"]
    started = time.time()
    with open(os.path.join(out_dir, f"{name}.log"), "w") as log:
        subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=True)
    text = pathlib.Path(out_dir, f"{name}.log").read_text()
    summary = json.loads(text.split("final summary: ")[-1].splitlines()[0])
    return {"command": " ".join(command[1:]), "steps": steps, "wall_s": time.time() - started,
            "eval": summary["eval"], "train": summary["train"]}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--bert_steps", type=int, default=1000)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    configs = {name: _config(path) for name, path in CONFIGS.items()}
    flops = {name: step_flops(c) for name, c in configs.items()}
    budget = args.bert_steps * flops["bert"]
    steps = {"bert": args.bert_steps, "modernbert": math.ceil(budget / flops["modernbert"])}
    results = {}
    for name in CONFIGS:
        results[name] = {
            "config": CONFIGS[name],
            "step_flops": flops[name],
            "total_flops": steps[name] * flops[name],
            "baseline": unigram_baseline(configs[name]),
            **run(name, args.out_dir, steps[name]),
        }
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("| config | steps | train PFLOP | held-out MLM acc | unigram baseline | wall s |")
    print("|---|---|---|---|---|---|")
    for r in results.values():
        print(f"| {r['config']} | {r['steps']} | {r['total_flops'] / 1e15:.2f} | "
              f"{100 * r['eval']['mlm_accuracy']:.1f}% | {100 * r['baseline']['share']:.1f}% | "
              f"{r['wall_s']:.0f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
