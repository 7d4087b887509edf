"""Tokenizing throughput of the byte-level BPE path beside WordPiece, on one host core each.

    python -m bench.bpe_throughput [--vocab_size=16000] [--reps=3] [--out=FILE.json]

Both tokenize the bundled corpus (``bertjax/data/corpus/kjv_train.txt.gz``) the way the data
pipeline does: ``tokenize`` in a ``tf.data`` map over batches of 256 lines
(``bertjax.data.tokenization``): WordPiece with the bundled vocab (tensorflow-text's op), BPE with
a tokenizer.json learnt on the same corpus by ``bertjax.vocab``'s ``train_bpe`` (HF
``tokenizers``' Rust encoder through ``tf.numpy_function``). Each timed pass is its own
subprocess pinned to one core (``taskset -c 0``) with TensorFlow's and tf.data's thread pools at
1 and ``TOKENIZERS_PARALLELISM=false``, so the figure is what one host core gives; passes are
interleaved over ``--reps`` rounds. Reports tokens per second (median, min-max) and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

_CHILD = r"""
import json, os, sys, time
import tensorflow as tf
tf.config.threading.set_inter_op_parallelism_threads(1)
tf.config.threading.set_intra_op_parallelism_threads(1)
from bertjax.data import bundled, tokenization
kind, vocab_file = sys.argv[1], sys.argv[2]
tokenizer = tokenization.create_tokenizer(kind, vocab_file, kind == "wordpiece")
import gzip
with gzip.open(bundled.bundled_paths().train, "rt", encoding="utf-8") as f:
    lines = [line for line in f.read().split("\n") if line]
options = tf.data.Options()
options.threading.private_threadpool_size = 1
data = tf.data.Dataset.from_tensor_slices(lines).batch(256).map(tokenizer.tokenize)
data = data.with_options(options)
for batch in data.take(2):  # tracing and the first batches, untimed
    pass
start, cpu = time.perf_counter(), time.process_time()
tokens = sum(int(tf.size(batch.flat_values)) for batch in data)
print(json.dumps({"tokens": tokens, "seconds": time.perf_counter() - start,
                  "cpu_seconds": time.process_time() - cpu}))
"""


def _pass(kind: str, vocab_file: str) -> dict:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "TF_CPP_MIN_LOG_LEVEL": "3"}
    command = ["taskset", "-c", "0", sys.executable, "-c", _CHILD, kind, vocab_file]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab_size", type=int, default=16000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    from bertjax.data import bundled, vocab  # noqa: PLC0415

    paths = bundled.bundled_paths()
    bpe = os.path.join(tempfile.mkdtemp(prefix="bpe-"), "tokenizer.json")
    vocab.train_bpe([paths.train], bpe, args.vocab_size, do_lower_case=False)
    files = {"wordpiece": paths.vocab, "bpe": bpe}
    rates: dict[str, list[float]] = {k: [] for k in files}
    tokens = {}
    for _ in range(args.reps):
        for kind, path in files.items():
            result = _pass(kind, path)
            rates[kind].append(result["tokens"] / result["seconds"])
            tokens[kind] = result["tokens"]
        print(json.dumps({k: round(v[-1]) for k, v in rates.items()}), flush=True)
    rows = {
        kind: {
            "tokens": tokens[kind],
            "tokens_per_s_median": statistics.median(r),
            "min": min(r),
            "max": max(r),
        }
        for kind, r in rates.items()
    }
    ratio = rows["bpe"]["tokens_per_s_median"] / rows["wordpiece"]["tokens_per_s_median"]
    print("| tokenizer | tokens in the corpus | tokens/s on one core (median, min-max) |")
    print("| --- | --- | --- |")
    for kind, row in rows.items():
        print(f"| {kind} | {row['tokens']:,} | {row['tokens_per_s_median'] / 1e6:.2f}M "
              f"({row['min'] / 1e6:.2f}-{row['max'] / 1e6:.2f}M) |")  # fmt: skip
    print(f"\nBPE / WordPiece: {ratio:.2f}x; {time.strftime('%Y-%m-%d')}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "ratio": ratio, "vocab_size": args.vocab_size}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
