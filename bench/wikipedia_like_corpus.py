"""A corpus with Wikipedia-like document lengths, made of the bundled KJV text, for measuring
padding and packing (issue 26) where Wikipedia itself cannot be downloaded.

What makes Wikipedia pad at 512 is its many short articles: a document shorter than the target
length gives one short instance. This corpus keeps that, and only that, from Wikipedia: each
document's length in words is drawn from a log-normal distribution with

* mean 650 words: English Wikipedia's words per article (about 4.4 billion words in about 6.7
  million articles; Wikipedia's "Size of Wikipedia" page, 2023);
* median 300 words: an assumption (Wikipedia publishes no median; stubs, a third of its articles,
  are under ~150 words), which makes the log-normal's sigma = sqrt(2 ln(650 / 300)) = 1.24;

clipped to [10, 20 000] words. Each document is filled with consecutive sentences of
``bertjax/data/corpus/kjv_train.txt.gz`` from a random start until it reaches its length (the
last sentence may overshoot by a few words), one sentence per line, documents separated by blank
lines (the original BERT input format). Deterministic in ``--seed``. Krell et al. (2021) measure
more than 50% padding on Wikipedia at 512 with the original data builder; this corpus's own
figure is in docs/benchmarks.md with the command that measured it.

**Stubs** (``--stub_share``, default 0: none): a corpus with many short documents, for the
packing default to hold on (issue 37). That share of the documents are stubs: a log-normal
length with median ``STUB_MEDIAN_WORDS`` = 12 words (sigma 0.6), at least two lines, made of
the bundled text's clauses (its verses cut after ``,``, ``;`` and ``:``, median 6 words), shuffled
among the articles. A stub of one line would be paired with a long random B (a one-sentence
chunk is NotNext); of two or more, half its instances are IsNext and short. With
``--stub_share=0.47`` and 3,000 articles (5,660 documents), at 512 9.9% of the instances are
under 25 tokens and 37.2% over 256 (a long tail both ways); at 128, 5.4% are under 25.

    python bench/wikipedia_like_corpus.py --output=/tmp/wiki_like.txt.gz --documents=3000
    python bench/wikipedia_like_corpus.py --output=/tmp/stubs.txt.gz --documents=3000 \
        --stub_share=0.47
"""

from __future__ import annotations

import argparse
import gzip
import math
import re

import numpy as np

from bertjax.data import bundled

MEAN_WORDS, MEDIAN_WORDS = 650.0, 300.0
SIGMA = math.sqrt(2 * math.log(MEAN_WORDS / MEDIAN_WORDS))
STUB_MEDIAN_WORDS, STUB_SIGMA = 12.0, 0.6


def kjv_sentences() -> list[str]:
    with gzip.open(bundled.bundled_paths().train, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def document_lengths(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    words = rng.lognormal(math.log(MEDIAN_WORDS), SIGMA, count)
    return np.clip(np.round(words), 10, 20_000).astype(int)


def documents(count: int, seed: int) -> list[list[str]]:
    sentences = kjv_sentences()
    words = [len(s.split()) for s in sentences]
    rng = np.random.default_rng(seed + 1)
    out = []
    for target in document_lengths(count, seed):
        i, total, doc = int(rng.integers(len(sentences))), 0, []
        while total < target:
            doc.append(sentences[i % len(sentences)])
            total += words[i % len(sentences)]
            i += 1
        out.append(doc)
    return out


def stubs(count: int, seed: int) -> list[list[str]]:
    """``count`` stub documents (module docstring): clauses of the bundled text, at least two."""
    sentences = kjv_sentences()
    clauses = [c for s in sentences for c in re.split(r"(?<=[,;:])\s+", s) if c.strip()]
    words = [len(c.split()) for c in clauses]
    rng = np.random.default_rng(seed + 2)
    out = []
    for _ in range(count):
        target = max(4, round(rng.lognormal(math.log(STUB_MEDIAN_WORDS), STUB_SIGMA)))
        i, total, doc = int(rng.integers(len(clauses))), 0, []
        while total < target or len(doc) < 2:
            doc.append(clauses[i % len(clauses)])
            total += words[i % len(clauses)]
            i += 1
        out.append(doc)
    return out


def with_stubs(docs: list[list[str]], share: float, seed: int) -> list[list[str]]:
    """``docs`` and stubs making ``share`` of the documents, in a seeded random order."""
    if share <= 0:
        return docs
    everything = docs + stubs(round(len(docs) * share / (1 - share)), seed)
    order = np.random.default_rng(seed + 3).permutation(len(everything))
    return [everything[i] for i in order]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="a .txt.gz (or .txt) file to write")
    parser.add_argument("--documents", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--stub_share", type=float, default=0.0, help="share of stub documents (beside articles)"
    )
    args = parser.parse_args()
    docs = with_stubs(documents(args.documents, args.seed), args.stub_share, args.seed)
    opener = gzip.open if args.output.endswith(".gz") else open
    with opener(args.output, "wt", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(doc) for doc in docs) + "\n")
    words = np.array([sum(len(s.split()) for s in doc) for doc in docs])
    print(f"{args.output}: {len(docs)} documents, {words.sum()} words; words per document: "
          f"mean {words.mean():.0f}, median {np.median(words):.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
