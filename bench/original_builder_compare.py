"""Google's ``create_pretraining_data.py`` and ``bertjax.create_pretraining_data`` side by side.

    python bench/original_builder_compare.py --original_dir=/tmp/original_bert \\
        [--seeds=1,2,3,4] [--megabytes=0] [--builders=original,bertjax] [-- SHARED FLAGS]

``--original_dir`` holds the original ``create_pretraining_data.py`` and ``tokenization.py``
(github.com/google-research/bert, fetched by you; nothing of it is in this repository). The
original runs unchanged under TF2: a shim makes its ``import tensorflow as tf`` import
``tensorflow.compat.v1``. Both tools read the same plain-text corpus (the bundled train corpus,
or its first ``--megabytes`` cut at a document break; 0 = all of it) with the bundled vocab, the
original's default flags plus any SHARED FLAGS, and each ``--seeds`` value as ``--random_seed``.
Both outputs are measured by the same code (``bertjax.data.stats.tfrecord_stats``, records
parsed with the original spec): examples, IsNext share, mean instance length (real tokens per
example), padding share, mask rate and the [MASK]/kept/random split. Prints one markdown row
per run and a summary (mean, sample standard deviation, min-max over seeds) per tool.
"""

import argparse
import gzip
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

# The original's own entry point, with `tensorflow` resolving to TF2's v1 compatibility module.
_SHIM = (
    "import runpy, sys; import tensorflow.compat.v1 as tf; sys.modules['tensorflow'] = tf; "
    "sys.path.insert(0, sys.argv[1]); script = sys.argv[1] + '/create_pretraining_data.py'; "
    "sys.argv = [script] + sys.argv[2:]; runpy.run_path(script, run_name='__main__')"
)


def write_corpus(path: str, megabytes: float) -> int:
    """The bundled train corpus as plain text (its first ``megabytes``, cut at a blank line)."""
    from bertjax.data import bundled

    with gzip.open(bundled.TRAIN_CORPUS, "rb") as f:
        text = f.read()
    if megabytes:
        cut = text.find(b"\n\n", int(megabytes * 1e6))
        text = text if cut < 0 else text[: cut + 1]
    with open(path, "wb") as f:
        f.write(text)
    return len(text)


def run_builder(builder: str, args, corpus: str, output: str, seed: int, extra: list[str]):
    """Runs one tool; returns its wall time in seconds."""
    from bertjax.data import bundled

    shared = [
        f"--input_file={corpus}",
        f"--output_file={output}",
        f"--vocab_file={bundled.VOCAB}",
        "--do_lower_case=true",
        f"--random_seed={seed}",
        *extra,
    ]
    if builder == "original":
        cmd = [sys.executable, "-c", _SHIM, args.original_dir, *shared]
    else:
        cmd = [sys.executable, "-m", "bertjax.create_pretraining_data", "--num_workers=1", *shared]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{builder} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def measure(output: str, max_seq_length: int, max_predictions: int) -> dict:
    import ml_collections

    from bertjax.data import bundled, stats, tokenization

    data_config = ml_collections.ConfigDict(
        dict(max_seq_length=max_seq_length, max_predictions_per_seq=max_predictions, nsp=True)
    )
    tokenizer = tokenization.create_tokenizer("wordpiece", bundled.VOCAB, True)
    s = stats.tfrecord_stats([output], data_config, tokenizer)
    return dict(
        examples=s["examples"],
        is_next=100 * (1 - s["not_next_fraction"]),
        mean_length=s["tokens"] / s["examples"],
        padding=100 * s["padding_fraction"],
        mask_rate=100 * s["mask_rate"],
        masked=100 * s["mask_split"][0],
        kept=100 * s["mask_split"][1],
        randomised=100 * s["mask_split"][2],
    )


COLUMNS = ("examples", "is_next", "mean_length", "padding", "mask_rate", "masked", "kept")
HEADER = (
    "| tool | seed | examples | IsNext % | mean length | padding % | mask rate % | [MASK] % | "
    "kept % | wall s |\n|" + " --- |" * 10
)


def print_summary(rows: dict) -> None:
    print("\n| tool | statistic | mean | std (seeds) | min | max |\n|" + " --- |" * 6)
    for builder, results in rows.items():
        for column in COLUMNS:
            values = [r[column] for r in results]
            std = statistics.stdev(values) if len(values) > 1 else 0.0
            print(
                f"| {builder} | {column} | {statistics.mean(values):.4f} | {std:.4f} | "
                f"{min(values):.4f} | {max(values):.4f} |"
            )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--original_dir", required=True)
    parser.add_argument("--seeds", default="1,2,3,4")
    parser.add_argument("--megabytes", type=float, default=0.0)
    parser.add_argument("--builders", default="original,bertjax")
    args, extra = parser.parse_known_args()
    extra = [e for e in extra if e != "--"]
    sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
    from bertjax import startup

    startup.import_tensorflow()  # without its start-up lines
    for name in ("create_pretraining_data.py", "tokenization.py"):
        if not os.path.exists(os.path.join(args.original_dir, name)):
            raise SystemExit(f"--original_dir={args.original_dir}: no {name} there")
    flag_values = dict(e.removeprefix("--").split("=", 1) for e in extra if "=" in e)
    length = int(flag_values.get("max_seq_length", 128))  # both tools' defaults
    predictions = int(flag_values.get("max_predictions_per_seq", 20))
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        size = write_corpus(corpus, args.megabytes)
        print(f"corpus: bundled train, {size / 1e6:.2f} MB; shared flags {extra or 'defaults'}")
        print(HEADER)
        rows = {b: [] for b in args.builders.split(",")}
        for seed in [int(s) for s in args.seeds.split(",")]:
            for builder, results in rows.items():
                output = os.path.join(tmp, f"{builder}-{seed}.tfrecord")
                wall = run_builder(builder, args, corpus, output, seed, extra)
                r = measure(output, length, predictions)
                os.remove(output)
                results.append(r)
                cells = " | ".join(
                    f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c]) for c in COLUMNS
                )
                print(f"| {builder} | {seed} | {cells} | {wall:.1f} |", flush=True)
        print_summary(rows)


if __name__ == "__main__":
    main()
