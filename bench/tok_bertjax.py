"""Our project's (bertjax) host tokenizer on the peers' shared corpus.

# venv: bertjax
# variants: default

Usage: python tok_bertjax.py [--mb N] [--reps R] [--batch 1024]
Copy next to the peers harness (``/work/shared/bench/peers``: ``common.py``, ``tokbench.py``) and
run there. Pipeline, as in tok_tftext.py: ``tf.data.TextLineDataset(corpus) -> batch(--batch) ->
map(bertjax WordPieceTokenizer.tokenize, AUTOTUNE) -> prefetch``; uncased vocab data/vocab.txt,
no [CLS]/[SEP]. The first (warm-up) pass keeps the ids for agree.py; timed passes only count.
"""

import argparse
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import common  # noqa: E402
import tokbench  # noqa: E402


def build_fn(lines, batch=1024):
    """Zero-arg callable: one pass over ``lines`` -> (n_tokens, per_line_ids or None)."""
    import tensorflow as tf

    from bertjax.data import tokenization

    tf.config.set_visible_devices([], "GPU")
    tokenizer = tokenization.WordPieceTokenizer(tokbench.VOCAB, do_lower_case=True)
    fd, path = tempfile.mkstemp(suffix=".txt")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    dataset = (
        tf.data.TextLineDataset(path)
        .batch(batch)
        .map(tokenizer.tokenize, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )
    passes = []

    def one_pass():
        keep = not passes  # only the warm-up pass returns ids
        passes.append(1)
        n_tokens, ids = 0, []
        for ragged in dataset:
            n_tokens += int(ragged.flat_values.shape[0])
            if keep:
                ids.extend(ragged.to_list())
        return n_tokens, ids if keep else None

    return one_pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", default="default")
    ap.add_argument("--batch", type=int, default=1024)
    tokbench.add_args(ap)
    args = ap.parse_args()
    impl = f"bertjax-{args.variant}"
    lines, nbytes = tokbench.load_lines(args.mb)
    try:
        fn = build_fn(lines, args.batch)
    except ImportError as e:
        common.emit_skip(
            "tokenize", impl, f"{type(e).__name__}: {e}", results_file="tokenize.jsonl"
        )
        return 3
    warm, ts, (ntok, ids) = tokbench.run_reps(fn, args.reps)
    if not args.no_save:
        tokbench.save_ids(impl, ids)
    import tensorflow as tf

    tokbench.emit_tok(
        impl,
        len(lines),
        nbytes,
        ntok,
        warm,
        ts,
        {"tensorflow": tf.__version__},
        notes=f"tf.data batch={args.batch}, map AUTOTUNE; BERT normalisation in TF ops",
        mb=args.mb,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
