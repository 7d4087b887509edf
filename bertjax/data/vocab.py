"""Builds a WordPiece vocab (or trains a SentencePiece model) from a plain-text corpus.

The command is ``python -m bertjax.vocab`` (``bertjax/vocab.py``). WordPiece: words are counted
after BERT's own normalisation and whitespace/punctuation split (``bertjax.data.tokenization``, the
same code that tokenizes later), then tensorflow-text's WordPiece learner picks at most
``vocab_size`` entries. The file starts with the special tokens ``[PAD] [UNK] [CLS] [SEP] [MASK]``
(ids 0-4), then ``[unused0..K-1]``, then every character seen (alone and as ``##c``, so unknown
words are rare), then the learned pieces by frequency.

SentencePiece: a unigram model with ``[PAD]`` (id 0) as the pad piece, ``[UNK]`` (id 1) as the
unknown piece and ``[CLS] [SEP] [MASK]`` (ids 2-4) as control symbols; the output is the
``.model`` file. Inputs may be gzip'd (``*.gz``). Outputs are written atomically
(``bertjax.atomic``, local or ``gs://``), so a failed run leaves nothing behind.
"""

from __future__ import annotations

import collections
import io
from collections.abc import Iterator

import tensorflow as tf
from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as learner

from bertjax import atomic
from bertjax.data import tokenization

_BATCH_LINES = 4096


class VocabError(ValueError):
    """Bad corpus or arguments for vocab building; the message names the file or flag."""


def expand_globs(patterns: str) -> list[str]:
    """``"a/*.txt,b.gz"`` -> sorted, de-duplicated list of files; error if a pattern is empty."""
    files: list[str] = []
    for pattern in (p.strip() for p in patterns.split(",")):
        if not pattern:
            continue
        matched = sorted(tf.io.gfile.glob(pattern))
        if not matched:
            raise VocabError(f"--input_file pattern {pattern!r} matches no file")
        files.extend(f for f in matched if f not in files)
    if not files:
        raise VocabError("--input_file is empty; expected GLOB[,GLOB...]")
    return files


def _line_batches(path: str) -> Iterator[tf.Tensor]:
    """<string>[<=_BATCH_LINES] batches of one (optionally gzip'd) file's lines."""
    compression = "GZIP" if path.endswith(".gz") else ""
    dataset = tf.data.TextLineDataset(path, compression_type=compression)
    try:
        yield from dataset.batch(_BATCH_LINES).prefetch(2)
    except tf.errors.OpError as e:
        raise VocabError(f"input file {path}: unreadable ({e.message.splitlines()[0]})") from None


def count_words(files: list[str], do_lower_case: bool) -> collections.Counter:
    """Word -> count over all files, after BERT's normalisation and pre-tokenization."""

    @tf.function
    def words_of(lines):
        # Fails on invalid UTF-8, which the string ops below would otherwise mangle silently.
        lines = tf.strings.unicode_transcode(lines, "UTF-8", "UTF-8", errors="strict")
        normalized = tokenization.bert_normalize(lines, do_lower_case)
        return tokenization.split_words(normalized).flat_values

    counts: collections.Counter = collections.Counter()
    for path in files:
        file_counts: collections.Counter = collections.Counter()
        try:
            for lines in _line_batches(path):
                file_counts.update(words_of(lines).numpy().tolist())
        except tf.errors.InvalidArgumentError:
            raise VocabError(f"input file {path}: not UTF-8") from None
        counts.update({word.decode("utf-8"): n for word, n in file_counts.items()})
    if not counts:
        raise VocabError(f"input files {','.join(files)}: no words (empty corpus)")
    return counts


def reserved_tokens(num_unused: int) -> list[str]:
    return [*tokenization.SPECIAL_TOKENS, *(f"[unused{i}]" for i in range(num_unused))]


def build_wordpiece_vocab(
    files: list[str], vocab_size: int, do_lower_case: bool = True, num_unused: int = 0
) -> list[str]:
    """Learns at most ``vocab_size`` WordPiece entries (layout in the module docstring)."""
    reserved = reserved_tokens(num_unused)
    if vocab_size <= len(reserved):
        raise VocabError(
            f"--vocab_size={vocab_size} must exceed the {len(reserved)} reserved tokens"
        )
    counts = count_words(files, do_lower_case)
    vocab = learner.learn(
        counts.items(),
        vocab_size,
        reserved,
        lower_thresh=1,  # small corpora: let the threshold search go down to count 1
        max_unique_chars=2000,
        max_token_length=50,
    )
    # The learner's threshold search can end just above the target; the tail is least frequent.
    return vocab[:vocab_size]


def write_vocab(vocab: list[str], path: str) -> None:
    """One token per line, UTF-8, written atomically."""
    atomic.write_bytes(path, ("\n".join(vocab) + "\n").encode("utf-8"))


def _sentences(files: list[str]) -> Iterator[str]:
    for path in files:
        for lines in _line_batches(path):
            for line in lines.numpy().tolist():
                if line.strip():
                    try:
                        yield line.decode("utf-8")
                    except UnicodeDecodeError as e:
                        raise VocabError(f"input file {path}: not UTF-8 ({e.reason})") from None


def train_sentencepiece(
    files: list[str], output_file: str, vocab_size: int, do_lower_case: bool = True
) -> None:
    """Trains a unigram SentencePiece model with the BERT special tokens at ids 0-4."""
    import sentencepiece as spm

    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_sentences(files),
            model_writer=model,
            vocab_size=vocab_size,
            model_type="unigram",
            pad_id=0,
            pad_piece="[PAD]",
            unk_id=1,
            unk_piece="[UNK]",
            bos_id=-1,
            eos_id=-1,
            control_symbols=["[CLS]", "[SEP]", "[MASK]"],
            normalization_rule_name="nmt_nfkc_cf" if do_lower_case else "nmt_nfkc",
            hard_vocab_limit=False,
            input_sentence_size=2_000_000,
            shuffle_input_sentence=True,
            minloglevel=2,
        )
    except RuntimeError as e:
        raise VocabError(f"sentencepiece training on {','.join(files)}: {e}") from None
    atomic.write_bytes(output_file, model.getvalue())
