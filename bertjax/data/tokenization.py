"""WordPiece, SentencePiece and byte-level BPE tokenizers on TensorFlow (no JAX).

All are graph-safe: ``tokenize`` takes a batch of strings ``<string>[N]`` and returns
``<int32>[N, (pieces)]``, so it runs inside ``tf.data.Dataset.map`` on batched lines. WordPiece
and SentencePiece are tensorflow-text ops; BPE (a HF ``tokenizer.json``, as ModernBERT ships:
:class:`BPETokenizer`) is HF ``tokenizers``' own Rust code, called on the batch through
``tf.numpy_function``.

WordPiece ids are identical to HuggingFace ``BertTokenizerFast`` (the reference, which reproduces
Google's original BERT tokenization), in uncased and cased modes. The steps, in the reference's
order, all vectorised TF string ops:

1. Literal special tokens (``[PAD] [UNK] [CLS] [SEP] [MASK]``, exact case) in the raw text are
   split out and mapped to their ids, as HF does for its registered special tokens.
2. Clean text: drop ``\\x00``, ``\\ufffd``, controls, format and private-use characters (but
   not ``\\t\\n\\r``); map Unicode whitespace to a space.
3. Uncased only: NFD, drop non-spacing marks (Mn), lowercase (character by character).
4. Split on whitespace and around punctuation (ASCII non-alphanumerics + Unicode P*) and CJK
   ideographs.
5. Greedy longest-match-first WordPiece with ``##`` continuations; a word longer than 100
   characters (``max_input_chars_per_word``) or with no full segmentation is one ``[UNK]``.

``tokenize`` routes rows of plain printable ASCII with no literal special token (nearly all of
an English corpus) through one end-to-end tf-text op, where steps 1-3 are identities or a
bytewise lower-case; the other rows take the general path above, and the results are merged
back in row order.

Input strings must be valid UTF-8 (``bertjax.vocab`` and the data pipeline check files).

The reference's character classes come from older Unicode tables than TensorFlow's RE2/ICU
(newer marks are not stripped nor newer punctuation split, some case mappings and
decompositions differ, final sigma is not special), so the classes are measured from the
reference in ``bertjax/data/unicode_tables.py``; tests check every code point in both modes.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import BinaryIO, TextIO

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text
from tensorflow_text.python.ops.regex_split_ops import gen_regex_split_ops

from bertjax.data import unicode_tables
from bertjax.data.special_tokens import SPECIAL_TOKENS

MAX_CHARS_PER_WORD = 100  # the original `max_input_chars_per_word`
_MAX_BYTES_PER_WORD = 4 * MAX_CHARS_PER_WORD  # UTF-8 bound; the char limit is applied separately
_SPECIAL_RE = r"\[(?:PAD|UNK|CLS|SEP|MASK)\]"
# A word the WordPiece model can only map to [UNK]: longer than the byte limit.
_UNK_WORD = "x" * (_MAX_BYTES_PER_WORD + 1)

_DROP_RE = f"[{unicode_tables.DROP}]"
_MN_RE = f"[{unicode_tables.NONSPACING_MARK}]"
# CJK ideographs are padded in the same pass as punctuation. The reference pads them before NFD,
# but NFD maps the only ideographs it changes (compatibility ideographs) to ideographs again.
_PUNCT_OR_CJK_RE = f"([{unicode_tables.PUNCT}{unicode_tables.CJK}])"


def _without_ascii(char_class: str) -> str:
    """An RE2 class body of ``\\x{..}`` items and ranges, minus its ASCII code points."""
    spans = re.findall(r"\\x\{([0-9A-F]+)\}(?:-\\x\{([0-9A-F]+)\})?", char_class)
    spans = [(int(lo, 16), int(hi or lo, 16)) for lo, hi in spans]
    return "".join(f"\\x{{{max(lo, 0x80):X}}}-\\x{{{hi:X}}}" for lo, hi in spans if hi >= 0x80)


# ASCII whitespace is left to split_words' ASCII split; mapping ' ' to itself is a costly no-op.
_NON_ASCII_SPACE_RE = f"[{_without_ascii(unicode_tables.SPACE)}]"


# Rows of printable ASCII (plus \t\n\r) without a literal special token skip the general path:
# there clean-text, NFD and accent stripping are identities, lower-casing is bytewise, and
# tf-text's end-to-end FastWordpieceTokenizer splits ASCII whitespace and punctuation exactly as
# the reference does, ~2.5x faster (one C++ op instead of ~15 regex and Unicode passes).
_PLAIN_ASCII_RE = r"[\t\n\r\x20-\x7E]*"
_HAS_SPECIAL_RE = f"(?s).*{_SPECIAL_RE}.*"


# Nothing here branches on tensors; skipping AutoGraph's source transformation saves seconds of
# tracing in every tf.function / tf.data.Dataset.map that calls a tokenizer.
_NOT_AUTOGRAPH = tf.autograph.experimental.do_not_convert


class TokenizerError(ValueError):
    """A vocabulary or tokenizer model that cannot be used; the message names the file."""


def _read_bytes(path: str, what: str) -> bytes:
    """The bytes of ``path`` (local or ``tf.io.gfile``); TokenizerError naming it if unreadable."""
    try:
        if not tf.io.gfile.exists(path):
            raise TokenizerError(f"{what} {path}: not found")
        if tf.io.gfile.isdir(path):
            raise TokenizerError(f"{what} {path}: a directory, expected a file")
        with tf.io.gfile.GFile(path, "rb") as f:
            return f.read()
    except tf.errors.OpError as e:
        message = (e.message or type(e).__name__).splitlines()[0]
        raise TokenizerError(f"{what} {path}: cannot read ({message})") from None


def read_vocab(vocab_file: str) -> list[str]:
    """Reads a ``vocab.txt`` (one token per line, id = line number); clear errors for bad files."""
    data = _read_bytes(vocab_file, "vocab file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TokenizerError(
            f"vocab file {vocab_file}: not UTF-8 ({e.reason} at byte {e.start})"
        ) from None
    vocab = text.split("\n")
    if vocab and vocab[-1] == "":
        vocab.pop()
    vocab = [t[:-1] if t.endswith("\r") else t for t in vocab]
    if not vocab:
        raise TokenizerError(f"vocab file {vocab_file}: empty, expected one token per line")
    seen = {}
    for i, token in enumerate(vocab):
        if not token:
            raise TokenizerError(f"vocab file {vocab_file}: line {i + 1} is empty")
        if "\x00" in token:  # tf-text's trie cannot hold it (and text never contains it)
            raise TokenizerError(f"vocab file {vocab_file}: line {i + 1} has a NUL character")
        if token in seen:
            raise TokenizerError(
                f"vocab file {vocab_file}: token {token!r} on lines {seen[token] + 1} and {i + 1}"
            )
        seen[token] = i
    return vocab


def _first_line(error: Exception, limit: int = 160) -> str:
    line = (str(error) or type(error).__name__).splitlines()[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _special_ids(vocab: list[str], source: str) -> dict[str, int]:
    index = {t: i for i, t in enumerate(vocab)}
    missing = [t for t in SPECIAL_TOKENS if t not in index]
    if missing:
        raise TokenizerError(f"vocab {source}: missing special token(s) {' '.join(missing)}")
    return {t: index[t] for t in SPECIAL_TOKENS}


class _SpecialTokensMixin:
    """Special-token attributes shared by both tokenizers; needs ``vocab`` and ``_special``."""

    vocab: list[str]
    _special: dict[str, int]

    def _init_specials(self, source: str) -> None:
        self._special = _special_ids(self.vocab, source)
        self.vocab_size = len(self.vocab)
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            self._special[t] for t in SPECIAL_TOKENS
        )

    @property
    def special_ids(self) -> set[int]:
        return set(self._special.values())

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.vocab[int(i)] for i in ids]

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Eager convenience: a list of strings -> a list of id lists (no [CLS]/[SEP])."""
        if not texts:
            return []
        return self.tokenize(tf.constant(list(texts), tf.string)).to_list()

    def encode_words(self, words: list[str]) -> list[list[int]]:
        """The pieces of each word of a text already split into words (NER tokens, SQuAD's
        whitespace tokens), as HF's fast tokenizers give them with ``is_split_into_words``:
        WordPiece and SentencePiece tokenize each word alone."""
        return self.encode(words)


@_NOT_AUTOGRAPH
def _map_code_points(texts: tf.Tensor, pairs: tuple[tuple[int, int], ...]) -> tf.Tensor:
    """Replaces code point ``a`` by ``b`` for each ``(a, b)``. <string>[N] -> <string>[N].

    For the few characters where TensorFlow's Unicode data differs from the reference's. Only
    the (rare) strings containing one are decoded, so the common path costs one regex scan.
    """
    if not pairs:
        return texts
    pairs = tuple(sorted(pairs))
    keys = tf.constant([a for a, _ in pairs], tf.int32)
    values = tf.constant([b for _, b in pairs], tf.int32)
    pattern = "(?s).*[" + "".join(f"\\x{{{a:X}}}" for a, _ in pairs) + "].*"
    rows = tf.where(tf.strings.regex_full_match(texts, pattern))  # <int64>[K, 1]
    chars = tf.strings.unicode_decode(tf.gather_nd(texts, rows), "UTF-8")  # [K, (chars)]
    flat = chars.flat_values
    slot = tf.minimum(tf.searchsorted(keys, flat), len(pairs) - 1)
    mapped = tf.where(tf.gather(keys, slot) == flat, tf.gather(values, slot), flat)
    fixed = tf.strings.unicode_encode(chars.with_flat_values(mapped), "UTF-8")
    return tf.tensor_scatter_nd_update(texts, rows, fixed)


# Characters to shield from TensorFlow's NFD travel as private-use code points, which cannot
# occur at that stage because clean-text has removed them.
_NFD_SHIELD = tuple((c, 0xE000 + i) for i, c in enumerate(unicode_tables.NFD_KEEP))
_NFD_UNSHIELD = tuple((p, c) for c, p in _NFD_SHIELD)
# tf.strings.lower applies the context-sensitive final sigma (word-final Σ -> ς); the reference
# lower-cases character by character (Σ -> σ), so Σ is lowered up front.
_BEFORE_LOWER = _NFD_SHIELD + ((0x3A3, 0x3C3),)


@_NOT_AUTOGRAPH
def bert_normalize(texts: tf.Tensor, do_lower_case: bool, fixups: bool = True) -> tf.Tensor:
    """BERT's text normalisation (steps 2-3 above). <string>[N] -> <string>[N]."""
    texts = tf.strings.regex_replace(texts, _DROP_RE, "")
    texts = tf.strings.regex_replace(texts, _NON_ASCII_SPACE_RE, " ")
    if do_lower_case:
        if fixups:
            texts = _map_code_points(texts, _BEFORE_LOWER)
        texts = tf_text.normalize_utf8(texts, "NFD")
        texts = tf.strings.regex_replace(texts, _MN_RE, "")
        texts = tf.strings.lower(texts, encoding="utf-8")
        if fixups:
            texts = _map_code_points(texts, unicode_tables.LOWERCASE + _NFD_UNSHIELD)
    return texts


@_NOT_AUTOGRAPH
def split_words(texts: tf.Tensor) -> tf.RaggedTensor:
    """Step 4 on normalised text. <string>[N] -> <string>[N, (words)]."""
    texts = tf.strings.regex_replace(texts, _PUNCT_OR_CJK_RE, r" \1 ")
    return tf.strings.split(texts)  # on ASCII whitespace


class WordPieceTokenizer(_SpecialTokensMixin):
    """BERT WordPiece from a standard ``vocab.txt``; ids identical to HF ``BertTokenizerFast``."""

    def __init__(self, vocab_file: str, do_lower_case: bool = True):
        self.vocab_file = vocab_file
        self.do_lower_case = bool(do_lower_case)
        self.vocab = read_vocab(vocab_file)
        self._init_specials(vocab_file)
        try:
            self._wordpiece = self._fast_wordpiece(_MAX_BYTES_PER_WORD, no_pretokenization=True)
            # ASCII rows only: there a byte is a character, so the byte limit is the reference's.
            self._plain_ascii = self._fast_wordpiece(MAX_CHARS_PER_WORD, no_pretokenization=False)
        except RuntimeError as e:  # tf-text's model builder: e.g. a token over 256 bytes
            raise TokenizerError(
                f"vocab file {vocab_file}: cannot build the WordPiece model ({_first_line(e)})"
            ) from None

    def _fast_wordpiece(self, max_bytes_per_word, no_pretokenization):
        return tf_text.FastWordpieceTokenizer(
            vocab=self.vocab,
            suffix_indicator="##",
            max_bytes_per_word=max_bytes_per_word,
            token_out_type=tf.int32,
            unknown_token="[UNK]",
            no_pretokenization=no_pretokenization,
        )

    @_NOT_AUTOGRAPH
    def tokenize_words(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """<string>[N] -> <int32>[N, (words), (pieces)]; one word per whitespace/punctuation unit.

        Graph-safe (usable in ``tf.data.Dataset.map`` on batched strings); a literal special
        token in the text is one word of one piece, its id.
        """
        texts = tf.convert_to_tensor(texts, tf.string)
        # regex_split stops at NUL; \x01 is dropped by the cleaning step just like NUL.
        texts = tf.strings.regex_replace(texts, r"\x00", "\x01")
        # Special tokens are matched on the raw text, before any normalisation, as HF does.
        segments = _split_specials(texts)  # [N, (segments)]
        flat = segments.flat_values
        special_id = tf.fill(tf.shape(flat), tf.constant(-1, tf.int32))
        for token, token_id in self._special.items():
            special_id = tf.where(tf.equal(flat, token), token_id, special_id)
        is_special = special_id >= 0
        flat = tf.where(is_special, _UNK_WORD, flat)
        words = split_words(bert_normalize(flat, self.do_lower_case))  # [S, (words)]
        # The reference's word limit counts characters; the tokenizer's counts bytes.
        too_long = tf.strings.length(words.flat_values, "UTF8_CHAR") > MAX_CHARS_PER_WORD
        words = words.with_flat_values(tf.where(too_long, _UNK_WORD, words.flat_values))
        pieces = self._wordpiece.tokenize(words)  # [S, (words), (pieces)]
        # A special segment is exactly one word of one piece ([UNK] from _UNK_WORD): swap its id.
        piece_special = tf.repeat(special_id, _pieces_per_segment(pieces))
        ids = tf.where(piece_special >= 0, piece_special, pieces.flat_values)
        pieces = pieces.with_flat_values(ids)
        return _merge_dims_1_2(segments.with_flat_values(pieces))

    @_NOT_AUTOGRAPH
    def tokenize(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """<string>[N] -> <int32>[N, (pieces)]; graph-safe, no [CLS]/[SEP] added.

        Plain-ASCII rows take the fast path (see ``_PLAIN_ASCII_RE``), the rest ``tokenize_words``;
        the two results are merged back in row order.
        """
        texts = tf.convert_to_tensor(texts, tf.string)
        plain = tf.logical_and(
            tf.strings.regex_full_match(texts, _PLAIN_ASCII_RE),
            tf.logical_not(tf.strings.regex_full_match(texts, _HAS_SPECIAL_RE)),
        )
        plain_rows = tf.where(plain)[:, 0]  # <int64>[P]
        other_rows = tf.where(tf.logical_not(plain))[:, 0]  # <int64>[N - P]
        plain_texts = tf.gather(texts, plain_rows)
        if self.do_lower_case:
            plain_texts = tf.strings.lower(plain_texts)  # bytewise: ASCII only
        other_ids = _merge_dims_1_2(self.tokenize_words(tf.gather(texts, other_rows)))
        ids = tf.concat([self._plain_ascii.tokenize(plain_texts), other_ids], axis=0)
        order = tf.math.invert_permutation(tf.concat([plain_rows, other_rows], axis=0))
        return tf.gather(ids, order)


def _split_specials(texts: tf.Tensor) -> tf.RaggedTensor:
    """<string>[N] -> <string>[N, (segments)]: literal special tokens become their own segments.

    ``tf_text.regex_split`` without its validated ``from_row_splits`` (three graph asserts, about
    0.6 s of tracing in every tf.data map); the op's row splits are well formed by construction.
    """
    pattern = f"({_SPECIAL_RE})"
    segments, _, _, row_splits = gen_regex_split_ops.regex_split_with_offsets(
        texts, pattern, pattern
    )
    return tf.RaggedTensor.from_row_splits(segments, row_splits, validate=False)


def _merge_dims_1_2(rt: tf.RaggedTensor) -> tf.RaggedTensor:
    """``rt.merge_dims(1, 2)`` without its graph asserts (the splits are valid by construction)."""
    splits = tf.gather(rt.values.row_splits, rt.row_splits)
    return tf.RaggedTensor.from_row_splits(rt.values.values, splits, validate=False)


def _pieces_per_segment(pieces: tf.RaggedTensor) -> tf.Tensor:
    """<int32>[S, (words), (pieces)] -> <int64>[S] number of pieces in each segment."""
    return tf.math.unsorted_segment_sum(
        pieces.values.row_lengths(), pieces.value_rowids(), pieces.nrows()
    )


class SentencePieceTokenizer(_SpecialTokensMixin):
    """A SentencePiece model (``.model`` file) with the BERT special tokens as pieces.

    ``do_lower_case`` lower-cases the input first; models trained by ``bertjax.vocab`` with
    ``--do_lower_case`` also case-fold in their own normaliser. Ids come from tensorflow-text's
    SentencePiece build, which may break exact segmentation ties (runs like ``=====``)
    differently from the ``sentencepiece`` package.
    """

    def __init__(self, vocab_file: str, do_lower_case: bool = False):
        self.vocab_file = vocab_file
        self.do_lower_case = bool(do_lower_case)
        model = _read_bytes(vocab_file, "sentencepiece model")
        import sentencepiece as spm  # only to validate the file and read its pieces

        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(model)
        except Exception as e:  # sentencepiece raises RuntimeError/OSError variants
            raise TokenizerError(f"sentencepiece model {vocab_file}: unreadable ({e})") from None
        self.vocab = [processor.IdToPiece(i) for i in range(processor.GetPieceSize())]
        self._init_specials(vocab_file)
        self._sp = tf_text.SentencepieceTokenizer(model=model, out_type=tf.int32)

    @_NOT_AUTOGRAPH
    def tokenize(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """<string>[N] -> <int32>[N, (pieces)]; graph-safe."""
        texts = tf.convert_to_tensor(texts, tf.string)
        if self.do_lower_case:
            texts = tf.strings.lower(texts, encoding="utf-8")
        return self._sp.tokenize(texts)

    @_NOT_AUTOGRAPH
    def tokenize_words(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """<string>[N] -> <int32>[N, (words), (pieces)]; a word starts at a piece with '▁'."""
        ids = self.tokenize(texts)
        starts = tf.strings.regex_full_match(
            tf.gather(tf.constant(self.vocab), ids.flat_values), "\u2581.*"
        )
        return _group_words(ids, starts)


def _group_words(ids: tf.RaggedTensor, starts: tf.Tensor) -> tf.RaggedTensor:
    """<int32>[N, (pieces)] -> <int32>[N, (words), (pieces)], a word opening at each piece whose
    ``starts`` (<bool> per piece of ``ids.flat_values``) is set and at each row's first piece."""
    position = tf.range(tf.size(ids.flat_values), dtype=tf.int64)
    first_in_row = tf.gather(ids.row_starts(), ids.value_rowids()) == position
    starts = tf.logical_or(starts, first_in_row)
    words = tf.RaggedTensor.from_row_starts(
        ids.flat_values, tf.boolean_mask(position, starts), validate=False
    )
    word_rows = tf.boolean_mask(ids.value_rowids(), starts)
    return tf.RaggedTensor.from_value_rowids(words, word_rows, ids.nrows(), validate=False)


BPE_WORD_START = "\u0120"  # byte-level BPE's mark of a piece that follows a space ('Ġ')


@_NOT_AUTOGRAPH
class BPETokenizer(_SpecialTokensMixin):
    """A HF ``tokenizer.json`` (byte-level BPE, as ModernBERT's, or any model HF ``tokenizers``
    reads) with the BERT special tokens ``[PAD] [UNK] [CLS] [SEP] [MASK]`` in its vocab.

    Ids are HF ``tokenizers``' ``encode_batch(texts, add_special_tokens=False)``: the library
    transformers' fast tokenizer runs, so they are its ids (literal special tokens in the text
    included: the file's added tokens). Casing is the file's own normaliser's: ``do_lower_case``
    is not read (lower-casing before a cased BPE would give ids its model never saw).
    """

    def __init__(self, vocab_file: str, do_lower_case: bool = False):
        self.vocab_file = vocab_file
        self.do_lower_case = bool(do_lower_case)
        data = _read_bytes(vocab_file, "tokenizer file")
        try:
            import tokenizers  # noqa: PLC0415 - the bpe extra
        except ImportError:
            raise TokenizerError(
                f"tokenizer file {vocab_file}: reading it needs HF tokenizers "
                "(pip install 'bertjax[bpe]')"
            ) from None
        try:
            self._tok = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
        except Exception as e:  # noqa: BLE001 - the Rust parser's errors: name the file
            raise TokenizerError(
                f"tokenizer file {vocab_file}: not a HF tokenizer.json ({_first_line(e)})"
            ) from None
        index = self._tok.get_vocab(with_added_tokens=True)
        self.vocab = [""] * (max(index.values()) + 1)
        for token, i in index.items():
            self.vocab[i] = token
        holes = [i for i, t in enumerate(self.vocab) if not t]
        if holes:
            raise TokenizerError(f"tokenizer file {vocab_file}: no token has id {holes[0]}")
        self._init_specials(vocab_file)

    def _encode(self, texts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lines = [t.decode("utf-8") for t in texts.reshape(-1)]
        # The ids only: no offsets (encode_batch_fast gives the same ids as encode_batch).
        ids = [e.ids for e in self._tok.encode_batch_fast(lines, add_special_tokens=False)]
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        flat = np.fromiter(itertools.chain.from_iterable(ids), np.int32, int(lengths.sum()))
        return flat, lengths

    @_NOT_AUTOGRAPH
    def tokenize(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """<string>[N] -> <int32>[N, (pieces)]; graph-safe (``tf.numpy_function``)."""
        texts = tf.convert_to_tensor(texts, tf.string)
        ids, lengths = tf.numpy_function(
            self._encode, [texts], [tf.int32, tf.int64], stateful=False
        )
        ids = tf.ensure_shape(ids, [None])
        lengths = tf.ensure_shape(lengths, [None])
        return tf.RaggedTensor.from_row_lengths(ids, lengths, validate=False)

    def encode_words(self, words: list[str]) -> list[list[int]]:
        """Each word after a space, as HF's byte-level BPE gives words with
        ``is_split_into_words`` and ``add_prefix_space``: 'Ġword', the form it takes inside a
        text."""
        return self.encode([" " + w for w in words])

    @_NOT_AUTOGRAPH
    def tokenize_words(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """<string>[N] -> <int32>[N, (words), (pieces)]; a word starts at a piece with 'Ġ' (a
        space before it), at a special token, or at the row's first piece."""
        ids = self.tokenize(texts)
        starts = tf.gather(tf.constant(_word_starts(self.vocab, self.special_ids)), ids.flat_values)
        return _group_words(ids, starts)


def _word_starts(vocab: list[str], special_ids) -> np.ndarray:
    """<bool>[V]: BPE pieces that open a word ('Ġ...', or a special token)."""
    starts = np.array([t.startswith(BPE_WORD_START) for t in vocab], dtype=bool)
    starts[list(special_ids)] = True
    return starts


TOKENIZER_KINDS = ("wordpiece", "sentencepiece", "bpe")


def create_tokenizer(kind: str, vocab_file: str, do_lower_case: bool):
    """``kind`` is ``"wordpiece"`` (vocab.txt), ``"sentencepiece"`` (.model file) or ``"bpe"``
    (a HF tokenizer.json)."""
    if kind == "wordpiece":
        return WordPieceTokenizer(vocab_file, do_lower_case)
    if kind == "sentencepiece":
        return SentencePieceTokenizer(vocab_file, do_lower_case)
    if kind == "bpe":
        return BPETokenizer(vocab_file, do_lower_case)
    raise TokenizerError(f"tokenizer kind {kind!r}: expected one of {', '.join(TOKENIZER_KINDS)}")


# ---------------------------------------------------------------- streams (bertjax.tokenize)

STREAM_BATCH_LINES = 4096


def _line_batches(stream: BinaryIO, batch_lines: int) -> Iterator[list[str]]:
    """Lists of at most ``batch_lines`` decoded lines, without their line endings."""
    batch: list[str] = []
    for number, raw in enumerate(stream, start=1):
        try:
            batch.append(raw.decode("utf-8").removesuffix("\n"))
        except UnicodeDecodeError as e:
            raise TokenizerError(f"stdin line {number}: not UTF-8 ({e.reason})") from None
        if len(batch) == batch_lines:
            yield batch
            batch = []
    if batch:
        yield batch


def tokenize_stream(tokenizer, stream: BinaryIO, out: TextIO,
                    batch_lines: int = STREAM_BATCH_LINES) -> None:  # fmt: skip
    """Writes one line of space-separated ids per line of ``stream`` (no special tokens; an
    empty line gives an empty line), ``batch_lines`` lines per in-graph call."""
    tokenize = tf.function(tokenizer.tokenize, input_signature=[tf.TensorSpec([None], tf.string)])
    for lines in _line_batches(stream, batch_lines):
        ids = tokenize(tf.constant(lines, tf.string))
        for row in ids.to_list():
            out.write(" ".join(map(str, row)) + "\n")
