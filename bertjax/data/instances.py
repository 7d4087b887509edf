"""Documents -> unmasked A/B pretraining instances (paper §3.1; the original
``create_pretraining_data.py``'s ``create_instances_from_document``), streaming. No JAX.

Reading: sentences (one per line, blank line between documents; or a TFDS text field split into
sentences) are tokenized in large batches by the tf-text tokenizer inside ``tf.data``; documents
are then assembled in numpy (flat ids + sentence lengths), each tokenized exactly once.

Pairing, per document, with ``random.Random`` seeded by ``(seed, dupe, document index)``, by the
original's rules:

* one target length per document: ``max_num_tokens`` (``max_seq_length - 3``), or with
  probability ``short_seq_prob`` a uniform ``randint(2, max_num_tokens)``;
* contiguous sentences are collected until they reach the target; a random split point makes A
  (the whole chunk when it has one sentence); B is the rest (IsNext, label 0) or, with
  probability 0.5 and always when the chunk has only one sentence, sentences from a random start
  in a *different* document up to the remaining length (NotNext, label 1; the unused sentences go
  back to the document);
* the pair is truncated to ``max_num_tokens`` by dropping tokens one at a time from the front or
  back (coin flip) of the longer segment.

Since every one-sentence chunk is NotNext, IsNext falls below half: 43.4% on the bundled corpus
at ``max_seq_length`` 128 (the original script: 43.6%; ``docs/benchmarks.md``, offline
TFRecords), about 39% at 64. ``split_single_sentence`` (``data.split_single_sentence``, default
False) is the paper's 50/50 instead: a one-sentence chunk of 2 or more tokens gets the coin flip
too, and on IsNext the sentence is split at a random token into A and its actual continuation B.
On the bundled corpus at 128 that gives 50.0% IsNext and shorter instances (114.2 against 117.3
tokens, 10.8% padding against 8.3%).

Where this differs from the original (the statistics agree within its seed spread:
``tests/data/original_statistics_test.py``):

* the NotNext document: the original draws it from the whole corpus held in RAM (shuffled; after
  ten draws of the current document it keeps it). To stream with bounded memory we draw it from a
  window of ``random_doc_pool`` documents around the current one (the ones before and after it in
  reading order, never the current one); the offline builder's window ends at its work unit
  (``bertjax.data.offline``). A share with a single document cannot form NotNext pairs and is an
  error;
* randomness: one seeded generator per document and dupe (so a document's instances do not depend
  on the others, nor on the documents read before it) where the original runs one generator
  through the whole corpus: the same distributions, other draws;
* order: document-major, every dupe of a document together; the original goes through all
  documents once per dupe and shuffles the whole list. The consumers shuffle (the pipeline's
  permutation, the offline builder's bounded buffer).

With ``nsp=False`` (No-NSP and left-to-right ablations) each instance is one segment
``[CLS] A [SEP]`` filled from contiguous sentences to the target length (``max_seq_length - 2``).
A sentence longer than the target becomes a chunk of its own and is truncated (counted in
``truncated``).

An instance is one ``<int32>[L + 4]`` row: ``L`` token ids (``[CLS] A [SEP] B [SEP]``, padded
with ``[PAD]``) then ``num_tokens``, ``segment_b_start`` (= ``num_tokens`` without B),
``next_sentence_label`` and ``truncated``.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import random
from collections.abc import Iterator

import numpy as np

NUM_META = 4  # num_tokens, segment_b_start, next_sentence_label, truncated
META_NUM_TOKENS, META_B_START, META_LABEL, META_TRUNCATED = range(NUM_META)


class DataError(ValueError):
    """Unusable input data or data settings; the message names the file or config field."""


@dataclasses.dataclass(frozen=True)
class InstanceOptions:
    """Pairing settings (the ``config.data`` fields of the same names) and special ids."""

    max_seq_length: int
    short_seq_prob: float
    nsp: bool
    dupe_factor: int
    random_doc_pool: int
    split_single_sentence: bool
    cls_id: int
    sep_id: int
    pad_id: int


@dataclasses.dataclass
class Document:
    """One tokenized document: ``ids <int32>[T]`` and ``sentence_lengths <int64>[S]`` (all > 0)."""

    ids: np.ndarray
    sentence_lengths: np.ndarray
    # Sentence starts, then T: S + 1 Python ints, because pairing does scalar look-ups and
    # bisection on them (several times per document), several times slower on numpy scalars.
    offsets: list = dataclasses.field(init=False)

    def __post_init__(self):
        self.offsets = [0, *np.cumsum(self.sentence_lengths).tolist()]


def line_dataset(path: str):
    """``<string>[]`` lines of one text file (gzip'd when the name ends in ``.gz``)."""
    import tensorflow as tf

    compression = "GZIP" if path.endswith(".gz") else ""
    return tf.data.TextLineDataset(path, compression_type=compression, buffer_size=1 << 20)


def _tokenize_lines(tokenizer, lines):
    """``<string>[n]`` -> ``(flat_ids <int32>[T], lengths <int64>[n], blank <bool>[n])``."""
    import tensorflow as tf

    pieces = tokenizer.tokenize(lines)
    blank = tf.equal(tf.strings.length(tf.strings.strip(lines)), 0)
    return pieces.flat_values, pieces.row_lengths(), blank


def tokenized_line_batches(lines_dataset, tokenizer, batch_lines: int = 2048):
    """``<string>[lines]`` dataset -> numpy batches ``(flat_ids <int32>[T], lengths <int64>[n],
    blank <bool>[n])``: the pieces of ``n`` lines and which lines are blank (document breaks)."""
    import tensorflow as tf

    # No autograph: converting the tokenizer's Python costs seconds and it has no control flow.
    tokenize = tf.autograph.experimental.do_not_convert(lambda x: _tokenize_lines(tokenizer, x))
    dataset = lines_dataset.batch(batch_lines).map(tokenize, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE).as_numpy_iterator()


def line_batch_tokenizer(tokenizer):
    """``f(lines: <object bytes>[n]) -> (flat_ids, lengths, blank)`` as numpy, the batches of
    ``tokenized_line_batches`` without a ``tf.data`` pipeline: one ``tf.function`` traced once
    per tokenizer (tracing costs ~0.5 s, too much to repeat for every small work unit)."""
    import tensorflow as tf

    spec = tf.TensorSpec([None], tf.string)
    traced = tf.function(lambda x: _tokenize_lines(tokenizer, x), [spec], autograph=False)

    def tokenize(lines):
        return tuple(t.numpy() for t in traced(tf.constant(lines, tf.string)))

    return tokenize


def documents_from_batches(batches, source: str) -> Iterator[Document]:
    """Assembles documents from tokenized line batches; empty lines split, empty docs skipped."""
    import tensorflow as tf

    ids_parts, length_parts = [], []

    def finish():
        lengths = np.concatenate(length_parts) if length_parts else np.zeros(0, np.int64)
        ids = np.concatenate(ids_parts) if ids_parts else np.zeros(0, np.int32)
        ids_parts.clear()
        length_parts.clear()
        if lengths.sum() > 0:
            return Document(ids.astype(np.int32), lengths[lengths > 0])
        return None

    try:
        for flat_ids, lengths, blank in batches:
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            start = 0
            for stop in [*np.flatnonzero(blank).tolist(), None]:
                end = len(lengths) if stop is None else stop
                if end > start:
                    ids_parts.append(flat_ids[offsets[start] : offsets[end]])
                    length_parts.append(lengths[start:end])
                if stop is not None:
                    document = finish()
                    if document is not None:
                        yield document
                    start = stop + 1
    except tf.errors.OpError as e:
        raise DataError(f"{source}: cannot read ({e.message.splitlines()[0]})") from None
    document = finish()
    if document is not None:
        yield document


def check_utf8(path: str, chunk_bytes: int = 1 << 22) -> None:
    """DataError naming ``path`` and the byte offset unless the (gzip'd) file is valid UTF-8.

    The tokenizer silently maps invalid bytes to [UNK]; a streaming decode here costs a few ms
    per MB, far less than tokenizing.
    """
    import codecs
    import gzip
    import zlib

    import tensorflow as tf

    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with tf.io.gfile.GFile(path, "rb") as raw:
        f = gzip.GzipFile(fileobj=raw) if path.endswith(".gz") else raw
        try:
            while chunk := f.read(chunk_bytes):
                decoder.decode(chunk)
                offset += len(chunk)
            decoder.decode(b"", final=True)
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: not UTF-8 text (byte {offset + e.start})") from None
        except (OSError, EOFError, zlib.error) as e:  # zlib.error: corrupt gzip data
            raise DataError(f"{path}: cannot read ({e})") from None


def read_text_documents(files: list[str], tokenizer, batch_lines: int = 2048) -> Iterator[Document]:
    """Documents of plain-text BERT-format files (gzip by ``.gz``), in file order."""
    for path in files:
        check_utf8(path)
        yield from documents_from_batches(
            tokenized_line_batches(line_dataset(path), tokenizer, batch_lines), path
        )


def split_sentences_tf(texts):
    """``<string>[N]`` running text -> ``<string>[N, (sentences)]``: split after ``.?!`` (and
    closing quotes/brackets) followed by whitespace; newlines always split."""
    import tensorflow as tf

    marked = tf.strings.regex_replace(texts, r"([.?!][\"'\)\]]*)\s+", "\\1\n")
    return tf.strings.split(marked, "\n")


def tfds_line_dataset(name: str, split: str, data_dir: str | None, text_field: str):
    """A TFDS text dataset as BERT-format lines: each example's ``text_field`` split into
    sentences, followed by a blank line. Reads a prepared ``data_dir`` only (no download)."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=data_dir or None)
        dataset = builder.as_dataset(split=split, shuffle_files=False)
    except Exception as e:  # tfds raises many types; the message is what the user needs
        raise DataError(f"data.tfds_name={name!r} split {split!r}: cannot load ({e})") from None
    if text_field not in builder.info.features:
        raise DataError(
            f"data.tfds_text_field={text_field!r}: not a feature of {name} "
            f"(has {sorted(builder.info.features)})"
        )

    def to_lines(example):
        sentences = split_sentences_tf(tf.reshape(example[text_field], [1])).flat_values
        return tf.data.Dataset.from_tensor_slices(tf.concat([sentences, [""]], axis=0))

    return dataset.flat_map(to_lines)


def truncation_drops(len_a: int, len_b: int, max_num_tokens: int) -> tuple[int, int]:
    """How many tokens the original ``truncate_seq_pair`` removes from A and from B.

    Its loop always trims the longer segment (B on ties), so the counts follow from the lengths
    alone: first the longer one down to the other's length (B one further on a tie), then the two
    alternate, starting with B if A was longer and with A otherwise.
    """
    excess = max(0, len_a + len_b - max_num_tokens)
    if len_a > len_b:
        first = min(excess, len_a - len_b)
        rest = excess - first
        return first + rest // 2, (rest + 1) // 2
    first = min(excess, len_b - len_a + 1)
    rest = excess - first
    return (rest + 1) // 2, first + rest // 2


def _truncate(len_a: int, len_b: int, max_num_tokens: int, rng: random.Random):
    """-> drops (a_front, a_back, b_front, b_back): each removed token is a fair coin between
    front and back, as in the original, drawn at once as the bits of one random integer."""
    drop_a, drop_b = truncation_drops(len_a, len_b, max_num_tokens)
    front_a = rng.getrandbits(drop_a).bit_count() if drop_a else 0
    front_b = rng.getrandbits(drop_b).bit_count() if drop_b else 0
    return front_a, drop_a - front_a, front_b, drop_b - front_b


def _fill_row(
    row: np.ndarray,
    a: np.ndarray,
    b,
    label: int,
    truncated: bool,
    length: int,
    opts: InstanceOptions,
) -> None:
    """Writes ``[CLS] A [SEP] (B [SEP])`` and the meta fields into a ``[PAD]``-filled row."""
    n_a = len(a)
    row[0] = opts.cls_id
    row[1 : 1 + n_a] = a
    row[1 + n_a] = opts.sep_id
    num_tokens = b_start = n_a + 2
    if b is not None:
        row[b_start : b_start + len(b)] = b
        num_tokens = b_start + len(b) + 1
        row[num_tokens - 1] = opts.sep_id
    row[length:] = (num_tokens, b_start, label, int(truncated))


def _rows(instances: list, opts: InstanceOptions) -> np.ndarray:
    """``(a, b, label, truncated)`` tuples -> ``<int32>[n, L + 4]``."""
    length = opts.max_seq_length
    block = np.full((len(instances), length + NUM_META), opts.pad_id, dtype=np.int32)
    for row, (a, b, label, truncated) in zip(block, instances, strict=True):
        _fill_row(row, a, b, label, truncated, length, opts)
    return block


def _random_b(pool, target_b_length: int, rng: random.Random) -> np.ndarray:
    document = pool[rng.randint(0, len(pool) - 1)]
    offsets = document.offsets
    start = rng.randint(0, len(offsets) - 2)
    # Whole sentences from `start` until the target is reached (at least one sentence).
    stop = min(
        bisect.bisect_left(offsets, offsets[start] + target_b_length, start + 1), len(offsets) - 1
    )
    return document.ids[offsets[start] : offsets[stop]]


def document_instances(
    document: Document, pool: list[Document], rng: random.Random, opts: InstanceOptions
) -> list[tuple]:
    """One document's instances as ``(a, b, label, truncated)``; ``pool`` excludes it."""
    max_num_tokens = opts.max_seq_length - (3 if opts.nsp else 2)
    target = max_num_tokens
    if rng.random() < opts.short_seq_prob:
        target = rng.randint(2, max_num_tokens)
    ids, offsets = document.ids, document.offsets
    num_sentences = len(offsets) - 1
    rows, chunk_start = [], 0
    while chunk_start < num_sentences:
        # The chunk ends at the first sentence that brings it to the target, or the last one.
        end = bisect.bisect_left(offsets, offsets[chunk_start] + target, chunk_start + 1)
        end = min(end, num_sentences)  # chunk = sentences [chunk_start, end)
        next_start = end
        if not opts.nsp:
            a = ids[offsets[chunk_start] : offsets[end]]
            front, back, _, _ = _truncate(len(a), 0, max_num_tokens, rng)
            rows.append((a[front : len(a) - back], None, 0, front + back > 0))
        else:
            chunk = end - chunk_start
            a_end = chunk_start + (rng.randint(1, chunk - 1) if chunk >= 2 else 1)
            a = ids[offsets[chunk_start] : offsets[a_end]]
            # A one-sentence chunk is NotNext without a coin flip, as in the original (whose
            # `or` short-circuits), unless the split variant may make it IsNext.
            forced = chunk == 1 and not opts.split_single_sentence
            label = 1 if forced or rng.random() < 0.5 else 0
            if chunk == 1 and label == 0 and len(a) >= 2:
                split = rng.randint(1, len(a) - 1)  # A and its actual continuation B
                a, b = a[:split], a[split:]
            elif chunk == 1 or label == 1:
                label = 1
                b = _random_b(pool, target - len(a), rng)
                next_start = a_end  # the unused sentences go back to the document
            else:
                b = ids[offsets[a_end] : offsets[end]]
            fa, ba, fb, bb = _truncate(len(a), len(b), max_num_tokens, rng)
            rows.append((a[fa : len(a) - ba], b[fb : len(b) - bb], label, fa + ba + fb + bb > 0))
        chunk_start = next_start
    return rows


def generate_instances(
    documents: Iterator[Document], seed: int, opts: InstanceOptions, source: str
) -> Iterator[np.ndarray]:
    """Streams ``<int32>[n, L + 4]`` instance blocks: every document's instances for each of
    ``dupe_factor`` pairings (document-major order). Raises DataError naming ``source`` when it
    has no documents, or one document while NSP needs a different one."""
    half = max(1, opts.random_doc_pool // 2)
    behind: collections.deque = collections.deque(maxlen=half)
    ahead: collections.deque = collections.deque()
    index = 0

    def emit(document):
        nonlocal index
        pool = list(behind) + list(ahead)
        if opts.nsp and not pool:
            raise DataError(f"{source}: a single document; NSP needs at least 2 documents")
        block = []
        for dupe in range(opts.dupe_factor):
            rng = random.Random(f"{seed}/{dupe}/{index}")  # str seeds are hashed (sha512)
            block.extend(document_instances(document, pool, rng, opts))
        behind.append(document)
        index += 1
        return _rows(block, opts) if block else None

    for document in documents:
        ahead.append(document)
        if len(ahead) > half:
            block = emit(ahead.popleft())
            if block is not None:
                yield block
    while ahead:
        block = emit(ahead.popleft())
        if block is not None:
            yield block
    if index == 0:
        raise DataError(f"{source}: no documents (empty input or only blank lines)")
