"""Builds a WordPiece vocab (or trains a SentencePiece model) from a plain-text corpus.

The command is ``python -m bertjax.vocab`` (``bertjax/vocab.py``). WordPiece: words are counted
after BERT's own normalisation and whitespace/punctuation split (``bertjax.data.tokenization``, the
same code that tokenizes later), then tensorflow-text's WordPiece learner picks at most
``vocab_size`` entries. The file starts with the special tokens ``[PAD] [UNK] [CLS] [SEP] [MASK]``
(ids 0-4), then ``[unused0..K-1]``, then every character seen (alone and as ``##c``, so unknown
words are rare), then the learned pieces by frequency.

SentencePiece: a unigram model with ``[PAD]`` (id 0) as the pad piece, ``[UNK]`` (id 1) as the
unknown piece and ``[CLS] [SEP] [MASK]`` (ids 2-4) as control symbols; the output is the
``.model`` file. It trains on at most ``SENTENCE_SAMPLE`` non-blank lines: those with the smallest
``sentence_key`` (a hash), in that order, a uniform sample that is the same however the corpus is
read. Inputs may be gzip'd (``*.gz``). Outputs are written atomically (``bertjax.atomic``, local
or ``gs://``), so a failed run leaves nothing behind.

Both learners take what the corpus reading gives them, so the reading can run elsewhere, on Beam
(``bertjax.data.vocab_beam``), with the same result: the WordPiece learner is given only what it
uses of the word counts (``LearnerInput``: at most ``MAX_INPUT_TOKENS`` words, whatever the
corpus; sums and filters that Beam's workers can compute), sorted, and the SentencePiece sample
does not depend on the order lines arrive in.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import heapq
import io
from collections.abc import Iterable, Iterator, Sequence

import tensorflow as tf
from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as learner

from bertjax import atomic
from bertjax.data import tokenization

_BATCH_LINES = 4096
SENTENCE_SAMPLE = 2_000_000  # lines SentencePiece trains on, at most (its own default cap)


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


class WordCounter:
    """Word -> count of line batches, after BERT's normalisation and pre-tokenization (the
    tokenizer's own code, ``bertjax.data.tokenization``)."""

    def __init__(self, do_lower_case: bool):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])  # one trace
        def words_of(lines):
            # Fails on invalid UTF-8, which the string ops below would otherwise mangle silently.
            lines = tf.strings.unicode_transcode(lines, "UTF-8", "UTF-8", errors="strict")
            normalized = tokenization.bert_normalize(lines, do_lower_case)
            return tokenization.split_words(normalized).flat_values

        self._words_of, self._counts = words_of, collections.Counter()

    def add(self, lines) -> None:
        """``lines``: <string>[N], a tensor or array (tf.errors.InvalidArgumentError if not
        UTF-8)."""
        self._counts.update(self._words_of(lines).numpy().tolist())

    def take(self) -> dict[str, int]:
        """The counts so far (then zero: the next ``add`` starts afresh)."""
        counts = {word.decode("utf-8"): n for word, n in self._counts.items()}
        self._counts = collections.Counter()
        return counts


def count_words(files: list[str], do_lower_case: bool) -> collections.Counter:
    """Word -> count over all files, after BERT's normalisation and pre-tokenization."""
    counter = WordCounter(do_lower_case)
    for path in files:
        try:
            for lines in _line_batches(path):
                counter.add(lines)
        except tf.errors.InvalidArgumentError:
            raise VocabError(f"input file {path}: not UTF-8") from None
    return collections.Counter(counter.take())


def reserved_tokens(num_unused: int) -> list[str]:
    return [*tokenization.SPECIAL_TOKENS, *(f"[unused{i}]" for i in range(num_unused))]


def check_wordpiece_size(vocab_size: int, num_unused: int) -> None:
    reserved = reserved_tokens(num_unused)
    if vocab_size <= len(reserved):
        raise VocabError(
            f"--vocab_size={vocab_size} must exceed the {len(reserved)} reserved tokens"
        )


# What ``learn_wordpiece`` asks of tensorflow-text's learner (``learner.learn``'s arguments).
MAX_TOKEN_LENGTH = 50  # longer words are not learned from
MAX_UNIQUE_CHARS = 2000  # the learner's alphabet: the most frequent characters
MAX_INPUT_TOKENS = 5_000_000  # the learner learns from the most frequent words only (its default)
_THRESHOLDS = (1, 10**7)  # its count threshold search: lower (small corpora: down to 1), upper


@dataclasses.dataclass(frozen=True)
class LearnerInput:
    """All that tensorflow-text's WordPiece learner uses of a corpus's word counts.

    ``learner.learn(counts)`` takes (1) the lowest and highest count of all words, where its
    threshold search starts; (2) its alphabet, the ``MAX_UNIQUE_CHARS`` characters most frequent
    in the words of at most ``MAX_TOKEN_LENGTH`` characters that are not reserved tokens
    (``allowed_chars``); (3) of those words, the ones spelled in that alphabet (``usable``), the
    ``MAX_INPUT_TOKENS`` most frequent (``input_cut``; ties in the order given: here by word).
    Then it learns from those words alone. ``words``: (3), ``(word, count)`` pairs; ``lowest``,
    ``highest``: (1), None for a corpus without words. Each step is a sum or a filter, so they
    can run on Beam's workers (``bertjax.data.vocab_beam``) and only ``words`` reach the learner.
    """

    words: list[tuple[str, int]]
    lowest: int | None
    highest: int | None


@dataclasses.dataclass(frozen=True)
class InputCut:
    """The learner's ``MAX_INPUT_TOKENS`` most frequent usable words: every one with a count
    above ``count``, then the ``ties`` first words (by word) with ``count`` itself."""

    count: int
    ties: int


def is_input_word(word: str, reserved: Sequence[str]) -> bool:
    return len(word) <= MAX_TOKEN_LENGTH and word not in reserved


def char_counts(word: str, count: int) -> list[tuple[str, int]]:
    """``(character, count)`` for each character of an input word, counted once per occurrence
    (as the learner weighs its alphabet)."""
    return [(char, count * n) for char, n in collections.Counter(word).items()]


def allowed_chars(char_totals: dict[str, int]) -> set[str]:
    """The learner's alphabet from the summed ``char_counts`` (its own ranking)."""
    return learner.get_allowed_chars(char_totals.items(), MAX_UNIQUE_CHARS)


def is_usable(word: str, allowed: set[str]) -> bool:
    return all(char in allowed for char in word)


def input_cut(words_per_count: dict[int, int]) -> InputCut:
    """How many usable words have each count -> the learner's cut (``InputCut``)."""
    taken = 0
    for count in sorted(words_per_count, reverse=True):
        if taken + words_per_count[count] >= MAX_INPUT_TOKENS:
            return InputCut(count, MAX_INPUT_TOKENS - taken)
        taken += words_per_count[count]
    return InputCut(0, 0)  # every usable word


def learner_input(counts: dict[str, int], num_unused: int) -> LearnerInput:
    """``LearnerInput`` of the word ``counts``, in this process."""
    reserved = reserved_tokens(num_unused)
    inputs = [(word, count) for word, count in counts.items() if is_input_word(word, reserved)]
    totals: collections.Counter = collections.Counter()
    for word, count in inputs:
        for char, n in char_counts(word, count):
            totals[char] += n
    allowed = allowed_chars(totals)
    usable = [(word, count) for word, count in inputs if is_usable(word, allowed)]
    cut = input_cut(collections.Counter(count for _, count in usable))
    ties = sorted(word for word, count in usable if count == cut.count)[: cut.ties]
    words = [(word, count) for word, count in usable if count > cut.count]
    values = counts.values()
    return LearnerInput(
        words + [(word, cut.count) for word in ties],
        min(values, default=None),
        max(values, default=None),
    )


def learn_wordpiece(
    given: LearnerInput, vocab_size: int, num_unused: int, files: list[str]
) -> list[str]:
    """tensorflow-text's WordPiece learner on what it uses of the word counts of ``files``
    (named in errors): the vocab ``learner.learn`` gives on all the counts (tested)."""
    if given.highest is None:
        raise VocabError(f"input files {','.join(files)}: no words (empty corpus)")
    lower, upper = _THRESHOLDS
    params = learner.Params(
        upper_thresh=upper,
        lower_thresh=lower,
        num_iterations=4,
        max_input_tokens=MAX_INPUT_TOKENS,
        max_token_length=MAX_TOKEN_LENGTH,
        max_unique_chars=MAX_UNIQUE_CHARS,
        vocab_size=vocab_size,
        slack_ratio=0.05,
        include_joiner_token=True,
        joiner="##",
        reserved_tokens=reserved_tokens(num_unused),
    )  # learner.learn's defaults, but for the thresholds' lower bound and the alphabet
    # learner.learn's own start of the search, from the lowest and highest count of all words.
    upper, lower = learner.get_search_threshs(
        [("", given.lowest), ("", given.highest)], upper, lower
    )
    words = sorted(given.words, key=lambda pair: (-pair[1], pair[0]))  # as learner.learn sorts
    vocab = learner.learn_binary_search(words, lower, upper, params)
    # The learner's threshold search can end just above the target; the tail is least frequent.
    return vocab[:vocab_size]


def write_vocab(vocab: list[str], path: str) -> None:
    """One token per line, UTF-8, written atomically."""
    atomic.write_bytes(path, ("\n".join(vocab) + "\n").encode("utf-8"))


def read_sentences(files: list[str]) -> Iterator[str]:
    """The non-blank lines of ``files``."""
    for path in files:
        for lines in _line_batches(path):
            for line in lines.numpy().tolist():
                if line.strip():
                    try:
                        yield line.decode("utf-8")
                    except UnicodeDecodeError as e:
                        raise VocabError(f"input file {path}: not UTF-8 ({e.reason})") from None


def sentence_key(sentence: str) -> tuple[int, str]:
    """What the SentencePiece sample sorts by: a 64-bit hash of the line, then the line."""
    digest = hashlib.blake2b(sentence.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big"), sentence


def sample_sentences(sentences: Iterable[str], limit: int = SENTENCE_SAMPLE) -> list[str]:
    """The ``limit`` sentences with the smallest ``sentence_key``, in key order."""
    return [sentence for _, sentence in heapq.nsmallest(limit, map(sentence_key, sentences))]


def train_sentencepiece(
    sentences: list[str], files: list[str], output_file: str, vocab_size: int, do_lower_case: bool
) -> None:
    """A unigram SentencePiece model with the BERT special tokens at ids 0-4, trained on
    ``sentences`` (``sample_sentences`` of ``files``, named in errors)."""
    import sentencepiece as spm

    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
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
            input_sentence_size=0,  # all of them: the sample is already drawn
            minloglevel=2,
        )
    except RuntimeError as e:
        raise VocabError(f"sentencepiece training on {','.join(files)}: {e}") from None
    atomic.write_bytes(output_file, model.getvalue())


def train_bpe(files: list[str], output_file: str, vocab_size: int, do_lower_case: bool) -> None:
    """A byte-level BPE ``tokenizer.json`` laid out as ModernBERT's (HF ``tokenizers``): NFC (and
    lower-casing when ``do_lower_case``) normalisation, GPT-2's byte-level pre-tokeniser with no
    prefix space, the BERT special tokens at ids 0-4 as added tokens, and a post-processor that
    wraps ``[CLS] A [SEP]`` / ``[CLS] A [SEP] B [SEP]`` (B in segment 1), so transformers' fast
    tokenizer loads it as is. Learnt from every non-blank line of ``files``, in file order."""
    try:
        import tokenizers  # noqa: PLC0415 - the bpe extra
        from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers
    except ImportError:
        raise VocabError("--type=bpe needs HF tokenizers (pip install 'bertjax[bpe]')") from None
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = tokenizers.Tokenizer(models.BPE())
    steps = [normalizers.NFC()] + ([normalizers.Lowercase()] if do_lower_case else [])
    tok.normalizer = normalizers.Sequence(steps)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(read_sentences(files), trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    atomic.write_bytes(output_file, tok.to_str(pretty=True).encode("utf-8"))
