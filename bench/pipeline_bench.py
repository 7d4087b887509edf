"""Host pipeline throughput vs HuggingFace ``tokenizers`` on the same text, interleaved in one run.

    python bench/pipeline_bench.py [--reps=3] [--batch_size=64] [--corpus=PATH]

Each measurement runs in its own subprocess so its peak RSS (``ru_maxrss``) is its own. The
machine is shared, so ``--reps`` rounds each run every mode in the order hf, 10x pipeline,
tokenizer, hf, 1x pipeline, FastBert; a run's ratio is taken against the HF runs of its own
round, and the table gives medians over rounds (and the min-max of the ratios):

* ``hf``: ``tokenizers.BertWordPieceTokenizer(vocab, lowercase=True).encode_batch(lines)`` over
  every non-blank line of the corpus (the peers' reference, ``shared/bench/peers/tok_hf.py``);
  ``--child_reps`` timed passes after one untimed pass. Its token count is the corpus size.
* ``tok`` / ``fastbert``: the tokenizer stage alone in ``tf.data`` (bertjax's
  ``tokenization.py``; raw tf-text ``FastBertTokenizer`` for comparison).
* ``pipeline``: the whole bertjax pipeline from an empty cache: read + tokenize (tf-text in
  tf.data) + pair + cache + permute + mask + batch, until one epoch of batches has been produced.
  tokens/s = corpus tokens / wall time (the same count as ``hf``, so the ratio is like for like).
  Then later epochs (instance table cached): tokens/s of real tokens in the batches.
* ``rss10``: the cold pipeline on the corpus repeated 10 times (build + 200 batches): peak RSS
  must not grow with the corpus; its tokens/s (10x corpus tokens / wall) amortises the fixed
  start cost (tokenizer graph tracing, first tf.data batches). Importing TensorFlow is excluded
  everywhere.

"tokens per CPU-s" divides the same token counts by the child process's CPU time over the same
interval (``time.process_time``: every thread of the process), which other jobs on a shared
machine disturb much less than wall time.
"""

import argparse
import gzip
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")


def _timed(count_tokens, reps: int) -> dict:
    """One warm-up call, then ``reps`` timed calls of ``count_tokens() -> int`` (wall and CPU)."""
    count_tokens()
    times, cpu, tokens = [], [], 0
    for _ in range(reps):
        start, cpu_start = time.perf_counter(), time.process_time()
        tokens = count_tokens()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)
    return dict(
        tokens=tokens,
        seconds=statistics.median(times),
        cpu_seconds=statistics.median(cpu),
        all_seconds=times,
    )


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _lines(path):
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def run_hf(args):
    import tokenizers

    from bertjax.data import bundled

    lines = _lines(args.corpus)
    tok = tokenizers.BertWordPieceTokenizer(bundled.VOCAB, lowercase=True)
    return _timed(
        lambda: sum(len(e.ids) for e in tok.encode_batch(lines, add_special_tokens=False)),
        args.reps,
    )


def run_tokenizer(args, fast=False):
    """The tokenizer stage alone in tf.data (bertjax's, or raw tf-text FastBertTokenizer)."""
    import tensorflow as tf
    import tensorflow_text as tf_text

    from bertjax.data import bundled, instances, tokenization

    if fast:  # what tf-text alone does (its own normalisation, not identical to BERT's on Unicode)
        vocab = tokenization.read_vocab(bundled.VOCAB)
        tok = tf_text.FastBertTokenizer(
            vocab, token_out_type=tf.int32, lower_case_nfd_strip_accents=True
        )
    else:
        tok = tokenization.create_tokenizer("wordpiece", bundled.VOCAB, True)
    lines = instances.line_dataset(args.corpus).batch(2048)
    count = tf.autograph.experimental.do_not_convert(
        lambda x: tf.reduce_sum(tok.tokenize(x).row_lengths())
    )  # as in the pipeline (instances.tokenized_line_batches)
    lines = lines.map(count, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    return _timed(lambda: sum(int(n) for n in lines.as_numpy_iterator()), args.reps)


def _config(args, cache_dir):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from configs import base

    config = base.get_config().data
    config.input_files = [args.corpus]
    config.cache_dir = cache_dir
    return config


def run_pipeline(args, max_batches=None):
    import numpy as np
    import tensorflow  # noqa: F401  (process start-up, not pipeline work: excluded like HF's)
    import tensorflow_text  # noqa: F401

    from bertjax.data import pipeline, sources

    with tempfile.TemporaryDirectory() as cache_dir:
        config = _config(args, cache_dir)
        kwargs = dict(batch_size=args.batch_size, seed=0, process_index=0, process_count=1)
        start, cpu_start = time.perf_counter(), time.process_time()
        dataset = pipeline.create_pretrain_dataset(config, **kwargs)
        built = time.perf_counter() - start
        table = sources.open_or_build(config, sources.create_tokenizer(config), "train", 0)
        epoch = -(-table.num_rows // args.batch_size)
        count = epoch if max_batches is None else min(max_batches, epoch)
        for _ in dataset.take(count):
            pass
        cold, cold_cpu = time.perf_counter() - start, time.process_time() - cpu_start
        times, cpu, tokens = [], [], 0
        for _ in range(args.reps if max_batches is None else 0):
            start, cpu_start = time.perf_counter(), time.process_time()
            tokens = sum(int(np.sum(b["input_mask"])) for b in dataset.take(epoch))
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - cpu_start)
    return dict(
        build_seconds=built,
        cold_seconds=cold,
        cold_cpu_seconds=cold_cpu,
        warm_cpu_seconds=statistics.median(cpu) if cpu else None,
        rows=table.num_rows,
        batches=count,
        warm_tokens=tokens,
        warm_seconds=statistics.median(times) if times else None,
    )


def _child(mode, args, corpus):
    cmd = [
        sys.executable,
        __file__,
        f"--child={mode}",
        f"--corpus={corpus}",
        f"--reps={args.child_reps}",
        f"--batch_size={args.batch_size}",
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


_TOKENIZER_RATES = (
    lambda r, n: r["tokens"] / r["seconds"],
    lambda r, n: r["tokens"] / r["cpu_seconds"],
)
# (row label, child mode, tokens/s from (that child's result, corpus tokens), the same per CPU
# second of the child process: all its threads, so it is robust to other jobs on the machine).
ROWS = (
    (
        "HF `tokenizers` encode_batch",
        "hf",
        *_TOKENIZER_RATES,
    ),
    (
        "`bertjax.data.tokenization` alone in tf.data",
        "tok",
        *_TOKENIZER_RATES,
    ),
    (
        "tf-text `FastBertTokenizer` alone in tf.data",
        "fastbert",
        *_TOKENIZER_RATES,
    ),
    (
        "**bertjax pipeline, cold, 10x corpus** (build + 200 batches)",
        "rss10",
        lambda r, n: 10 * n / r["cold_seconds"],
        lambda r, n: 10 * n / r["cold_cpu_seconds"],
    ),
    (
        "bertjax pipeline, cold, 1x corpus (one epoch)",
        "pipeline",
        lambda r, n: n / r["cold_seconds"],
        lambda r, n: n / r["cold_cpu_seconds"],
    ),
    (
        "bertjax pipeline, warm epochs (cached table)",
        "pipeline",
        lambda r, n: r["warm_tokens"] / r["warm_seconds"],
        lambda r, n: r["warm_tokens"] / r["warm_cpu_seconds"],
    ),
)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", default=None)
    parser.add_argument("--reps", type=int, default=3, help="interleaved rounds of every mode")
    parser.add_argument("--child_reps", type=int, default=1, help="timed passes in one child")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    if args.child:
        runners = {
            "hf": lambda: run_hf(args),
            "tok": lambda: run_tokenizer(args),
            "fastbert": lambda: run_tokenizer(args, fast=True),
            "pipeline": lambda: run_pipeline(args),
            "rss10": lambda: run_pipeline(args, max_batches=200),
        }
        result = runners[args.child]()
        result["peak_rss_mb"] = _peak_rss_mb()
        print(json.dumps(result))
        return
    from bertjax.data import bundled

    corpus = args.corpus or bundled.TRAIN_CORPUS
    modes = ("hf", "rss10", "tok", "hf", "pipeline", "fastbert")
    rounds, loads = [], [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        big = os.path.join(tmp, "corpus10x.txt")
        text = "\n".join(_lines_with_blanks(corpus))
        with open(big, "w") as f:
            for _ in range(10):
                f.write(text + "\n\n")
        for _ in range(args.reps):  # HF runs twice a round, next to the runs it is compared with
            results = [(m, _child(m, args, big if m == "rss10" else corpus)) for m in modes]
            rounds.append(results)
            loads.append(os.getloadavg()[0])
    _report(corpus, rounds, loads)


def _report(corpus, rounds, loads):
    tokens = rounds[0][0][1]["tokens"]
    print(
        f"corpus {corpus}: {tokens} tokens; {len(rounds)} interleaved rounds; "
        f"load average (1 min) {' '.join(f'{x:.1f}' for x in loads)}"
    )
    print("| run | tokens/s (median) | x HF (median, min-max) | tokens per CPU-s | peak RSS MB |")
    print("| --- | --- | --- | --- | --- |")
    for label, mode, rate_fn, cpu_rate_fn in ROWS:
        rates, ratios, cpu_rates, rss = [], [], [], []
        for results in rounds:
            hf = statistics.median(r["tokens"] / r["seconds"] for m, r in results if m == "hf")
            for m, r in results:
                if m == mode:
                    rates.append(rate_fn(r, tokens))
                    ratios.append(rates[-1] / hf)
                    cpu_rates.append(cpu_rate_fn(r, tokens))
                    rss.append(r["peak_rss_mb"])
                    break
        print(
            f"| {label} | {statistics.median(rates) / 1e6:.3f}M | "
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) | "
            f"{statistics.median(cpu_rates) / 1e6:.3f}M | {min(rss):.0f}-{max(rss):.0f} |"
        )
    print(json.dumps(rounds))


def _lines_with_blanks(path):
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        return [line.rstrip("\n") for line in f]


if __name__ == "__main__":
    main()
