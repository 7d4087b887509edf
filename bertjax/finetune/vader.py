"""A small real labeled sentiment set that ships in a package: the VADER lexicon, as SST-2 TSVs.

VADER (Hutto & Gilbert, 2014; PyPI ``vaderSentiment``, MIT) ships ``vader_lexicon.txt``: about
7,500 English words and emoticons, each rated for valence by ten human raters (-4..4). Words
(alphabetic entries) whose mean rating is at least ``min_abs_rating`` in absolute value become
SST-2 examples (``sentence<TAB>label``, 1 = positive); every ``dev_every``-th word in sorted
order goes to dev. Used to show that fine-tuning from real pretrained weights learns.

    python -m bertjax.finetune.vader --out=/tmp/vader_sst2
"""

from __future__ import annotations

import os

from absl import app, flags
from etils import epath

from bertjax import atomic
from bertjax.finetune.tasks import FinetuneInputError


def lexicon_path() -> str:
    try:
        import vaderSentiment
    except ImportError:
        raise FinetuneInputError(
            "the vaderSentiment package is not installed (pip install vaderSentiment==3.3.2)"
        ) from None
    return os.path.join(os.path.dirname(vaderSentiment.__file__), "vader_lexicon.txt")


def read_lexicon(min_abs_rating: float = 1.0) -> list[tuple[str, int]]:
    """Sorted (word, label) pairs: label 1 when the mean rating is >= +min, 0 when <= -min."""
    pairs = []
    path = lexicon_path()
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, 1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) < 2:
                raise FinetuneInputError(f"{path}:{line_number}: expected word<TAB>mean rating")
            word, mean = fields[0], float(fields[1])
            if word.isalpha() and word.isascii() and abs(mean) >= min_abs_rating:
                pairs.append((word, int(mean > 0)))
    return sorted(pairs)


def write_sst2(
    out_dir: str,
    *,
    dev_every: int = 5,
    min_abs_rating: float = 1.0,
    max_train: int = 0,
    max_dev: int = 0,
) -> dict[str, int]:
    """Writes ``train.tsv`` and ``dev.tsv`` in SST-2's format; returns the example counts."""
    pairs = read_lexicon(min_abs_rating)
    dev = [p for i, p in enumerate(pairs) if i % dev_every == 0]
    train = [p for i, p in enumerate(pairs) if i % dev_every != 0]
    # Interleave classes deterministically before truncating, so small subsets stay balanced-ish.
    train = train[:: max(1, len(train) // max_train)][:max_train] if max_train else train
    dev = dev[:: max(1, len(dev) // max_dev)][:max_dev] if max_dev else dev
    epath.Path(out_dir).mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("dev", dev)):
        text = "sentence\tlabel\n" + "".join(f"{w}\t{label}\n" for w, label in rows)
        atomic.write_text(os.path.join(out_dir, f"{name}.tsv"), text)
    return {
        "train": len(train),
        "dev": len(dev),
        "dev_majority": max(sum(lab for _, lab in dev), sum(1 - lab for _, lab in dev)),
    }


def main(argv) -> None:
    del argv
    print(write_sst2(flags.FLAGS.out))


if __name__ == "__main__":
    # Flags are defined here, not at import, so importing this module never clashes with others.
    flags.DEFINE_string("out", None, "output directory for train.tsv / dev.tsv")
    flags.mark_flag_as_required("out")
    app.run(main)
