"""The bundled default corpus (King James Bible, public domain) and its WordPiece vocab.

Plain-text BERT format (one sentence per line, blank line between documents; one document per
chapter), gzip'd, in ``bertjax/data/corpus/``. See ``corpus/PROVENANCE.md`` for the source,
licence and how the files were made.
Importing this module is cheap (no TensorFlow).
"""

import pathlib
from typing import NamedTuple

_HERE = pathlib.Path(__file__).parent / "corpus"

TRAIN_CORPUS = str(_HERE / "kjv_train.txt.gz")  # 1160 chapters, ~4.0 MB of text
EVAL_CORPUS = str(_HERE / "kjv_eval.txt.gz")  # 29 held-out chapters (every 40th)
VOCAB = str(_HERE / "kjv_vocab_uncased.txt")  # uncased WordPiece built from TRAIN_CORPUS


class BundledPaths(NamedTuple):
    train: str
    eval: str
    vocab: str


def bundled_paths() -> BundledPaths:
    """Returns the absolute paths of the bundled train corpus, eval corpus and vocab."""
    return BundledPaths(TRAIN_CORPUS, EVAL_CORPUS, VOCAB)
