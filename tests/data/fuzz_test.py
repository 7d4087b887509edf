"""Fuzz tests of the pretraining readers: corpus text and ``.gz`` files, WordPiece vocabs,
SentencePiece models and TFRecords. Each input is read and either gives data or a one-line
DataError / TokenizerError naming the file (tests/fuzzing.py).

The readers that run TensorFlow cost ~0.1-0.3 s an input, so they get fewer examples than the
pure-Python byte checks in front of them.
"""

import gzip
import re
import tempfile

import hypothesis.strategies as st
import ml_collections
import numpy as np
import pytest
import tensorflow as tf

from bertjax.data import bundled, instances, pipeline, tfrecords, tokenization, work_units
from bertjax.data.instances import DataError
from tests.fuzzing import TEXT, check_one_line, file_contents, fuzz, mutated

SENTENCE = "In the beginning God created the heaven and the earth; And it came to pass."


def _corpus_sample() -> bytes:
    """Three short documents of the bundled eval corpus (one sentence a line, blank between)."""
    with gzip.open(bundled.EVAL_CORPUS, "rt", encoding="utf-8") as f:
        lines = [next(f).rstrip("\n") for _ in range(9)]
    documents = [lines[0:3], lines[3:6], lines[6:9]]
    return "\n\n".join("\n".join(d) for d in documents).encode() + b"\n"


CORPUS = _corpus_sample()


@st.composite
def corpus_files(draw) -> tuple[str, bytes]:
    """(file name, contents): plain text, gzip'd (mutated) text, or mutated gzip bytes."""
    kind = draw(st.sampled_from(["text", "gzip of text", "gzip bytes"]))
    if kind == "text":
        return "corpus.txt", draw(file_contents(CORPUS, b" "))
    if kind == "gzip of text":
        return "corpus.txt.gz", gzip.compress(draw(file_contents(CORPUS, b" ")), mtime=0)
    return "corpus.txt.gz", draw(file_contents(gzip.compress(CORPUS, mtime=0), b"\n"))


def _write(tmp_path, name: str, contents: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(contents)
    return str(path)


def test_corpus_bytes(tmp_path, record_property):
    """The byte-level readers: the UTF-8/gzip check, and the work units of
    create_pretraining_data (cutting at documents, then reading each unit's lines)."""

    def check(case):
        path = _write(tmp_path, *case)
        for read in (
            lambda: instances.check_utf8(path),
            lambda: [
                list(work_units.unit_lines(u)) for u in work_units.work_units([path], unit_bytes=64)
            ],
        ):
            try:
                read()
            except DataError as e:
                check_one_line(e, path)

    fuzz(
        record_property,
        "corpus bytes (check_utf8, work_units)",
        corpus_files(),
        check,
        max_examples=300,
    )


@pytest.fixture(scope="module")
def wordpiece():
    return tokenization.create_tokenizer("wordpiece", bundled.VOCAB, True)


@st.composite
def corpus_texts(draw):
    """Valid UTF-8 corpus files (the byte checks above stop the rest): mutated documents with
    control characters, literal special tokens, long words, blank-only and empty files."""
    if draw(st.booleans()):
        text = draw(mutated(CORPUS, b" ")).decode("utf-8", "replace")
    else:
        pieces = st.sampled_from(
            [
                "\n",
                "\n\n",
                " \t\n",
                "[CLS]",
                "[SEP] x",
                "\x00",
                "\u2028",
                "\r\n",
                "y" * 300,
                SENTENCE,
            ]
        )
        text = "".join(draw(st.lists(TEXT | pieces, max_size=8)))
    return draw(st.sampled_from(["corpus.txt", "corpus.txt.gz"])), text.encode("utf-8")


def test_corpus_documents(tmp_path, wordpiece, record_property):
    """Tokenized documents -> A/B instances, through the tf.data reader of training and the
    work-unit reader of create_pretraining_data."""
    options = instances.InstanceOptions(
        max_seq_length=16,
        short_seq_prob=0.1,
        nsp=True,
        dupe_factor=1,
        random_doc_pool=4,
        split_single_sentence=False,
        cls_id=wordpiece.cls_id,
        sep_id=wordpiece.sep_id,
        pad_id=wordpiece.pad_id,
    )
    tokenize = instances.line_batch_tokenizer(wordpiece)

    def check(case):
        name, contents = case
        if name.endswith(".gz"):
            contents = gzip.compress(contents, mtime=0)
        path = _write(tmp_path, name, contents)

        def by_units():
            units = work_units.work_units([path], unit_bytes=256)
            return (d for u in units for d in work_units.unit_documents(u, tokenize))

        for documents in (lambda: instances.read_text_documents([path], wordpiece), by_units):
            try:
                for block in instances.generate_instances(documents(), 0, options, path):
                    assert block.shape[1] == options.max_seq_length + instances.NUM_META
            except DataError as e:
                check_one_line(e, path)

    fuzz(
        record_property,
        "corpus documents (read_text_documents, unit_documents)",
        corpus_texts(),
        check,
        max_examples=8,
    )


def _vocab_sample() -> bytes:
    """The specials, punctuation and words, and some ``##`` pieces of the bundled vocab."""
    with open(bundled.VOCAB, "rb") as f:
        lines = f.read().split(b"\n")
    continuations = [t for t in lines if t.startswith(b"##")][:10]
    return b"\n".join(lines[:40] + continuations + lines[1000:1010]) + b"\n"


def _reads_vocab(path: str, kind: str, lower: bool) -> None:
    try:
        tokenizer = tokenization.create_tokenizer(kind, path, lower)
    except tokenization.TokenizerError as e:
        check_one_line(e, path)
        return
    ids = tokenizer.encode([SENTENCE, "[CLS] \u00e9t\u00e9 ##x"])
    assert all(0 <= i < tokenizer.vocab_size for row in ids for i in row)


def test_wordpiece_vocab(tmp_path, record_property):
    """Wrong sizes, duplicates, missing specials, binary junk, ``##`` pieces mangled."""
    vocab = _vocab_sample()
    contents = st.one_of(file_contents(vocab, b"#"), mutated(vocab, b"\n", max_mutations=6))

    def check(case):
        _reads_vocab(_write(tmp_path, "vocab.txt", case[0]), "wordpiece", case[1])

    fuzz(
        record_property,
        "WordPiece vocab.txt (read_vocab, WordPieceTokenizer)",
        st.tuples(contents, st.booleans()),
        check,
        max_examples=60,
    )


def _sentencepiece_model(tmp_path) -> bytes:
    """A small model as ``bertjax.vocab --type=sentencepiece`` trains it (BERT's special ids)."""
    from bertjax.data import vocab

    corpus = tmp_path / "corpus.txt"
    with gzip.open(bundled.EVAL_CORPUS, "rt", encoding="utf-8") as f:
        corpus.write_text("".join(line for line, _ in zip(f, range(300), strict=False)))
    sentences = vocab.sample_sentences(vocab.read_sentences([str(corpus)]))
    vocab.train_sentencepiece(sentences, [str(corpus)], str(tmp_path / "sp.model"), 120, False)
    return (tmp_path / "sp.model").read_bytes()


def test_sentencepiece_model(tmp_path, record_property):
    model = _sentencepiece_model(tmp_path)

    def check(contents):
        _reads_vocab(_write(tmp_path, "sp.model", contents), "sentencepiece", False)

    fuzz(
        record_property,
        "SentencePiece .model (SentencePieceTokenizer)",
        file_contents(model, b"\n"),
        check,
        max_examples=100,
    )


# ---- TFRecords: a 3-record file of the original format (L = 8, P = 2), mutated as bytes or
# ---- rewritten with records whose features have other names, types or lengths.

LENGTH, PREDICTIONS = 8, 2
SPEC = tfrecords.feature_spec(LENGTH, PREDICTIONS)


def _valid_record(r: int) -> bytes:
    features = {
        "input_ids": np.array([[2, 5 + r, 3, 0, 0, 0, 0, 0]]),
        "input_mask": np.array([[1, 1, 1, 0, 0, 0, 0, 0]]),
        "segment_ids": np.zeros((1, LENGTH), np.int64),
        "masked_lm_positions": np.array([[1, 0]]),
        "masked_lm_ids": np.array([[7, 0]]),
        "masked_lm_weights": np.array([[1.0, 0.0]]),
        "next_sentence_labels": np.array([r % 2]),
    }
    return tfrecords.serialize_rows(features)[0]


def _feature(kind: str, length: int) -> tf.train.Feature:
    if kind == "int64":
        return tf.train.Feature(int64_list=tf.train.Int64List(value=range(length)))
    if kind == "float":
        return tf.train.Feature(float_list=tf.train.FloatList(value=[0.5] * length))
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"x"] * length))


@st.composite
def _odd_record(draw) -> bytes:
    """A valid record with 1-3 features retyped, resized, dropped or renamed; or random bytes."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.binary(max_size=40))
    example = tf.train.Example.FromString(_valid_record(0))
    features = example.features.feature
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(sorted(SPEC)))
        action = draw(st.sampled_from(["retype", "resize", "drop", "rename"]))
        if action == "drop" or action == "rename":
            value = tf.train.Feature()
            value.CopyFrom(features[name])
            del features[name]
            if action == "rename":
                features[name.upper()].CopyFrom(value)
        else:
            kind = draw(st.sampled_from(["int64", "float", "bytes"]))
            length = int(SPEC[name].shape[0]) if action == "retype" else draw(st.integers(0, 12))
            features[name].CopyFrom(_feature(kind, length))
    return example.SerializeToString(deterministic=True)


def _framed(records: list[bytes]) -> bytes:
    """TFRecord framing (lengths and CRCs) around each record, as TFRecordWriter writes it."""
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/records.tfrecord"
        with tf.io.TFRecordWriter(path) as writer:
            for record in records:
                writer.write(record)
        with open(path, "rb") as f:
            return f.read()


VALID_TFRECORDS = _framed([_valid_record(r) for r in range(3)])


@st.composite
def tfrecord_files(draw) -> bytes:
    """The valid file with its bytes mutated, or a file of valid and odd records."""
    if draw(st.booleans()):
        return draw(file_contents(VALID_TFRECORDS, b"\x00"))
    record = st.builds(_valid_record, st.integers(0, 9)) | _odd_record()
    return _framed(draw(st.lists(record, min_size=1, max_size=4)))


def _tfrecord_config(path: str) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        dict(
            source="tfrecord",
            input_files=[path],
            eval_input_files=[path],
            max_seq_length=LENGTH,
            max_predictions_per_seq=PREDICTIONS,
            shuffle_buffer=1,
        )
    )


def test_tfrecords(tmp_path, record_property):
    """check_tfrecords (the first record) and every record of the train and eval streams."""
    path = str(tmp_path / "part-0.tfrecord")
    config = _tfrecord_config(path)

    def batches(split):
        dataset = tfrecords.tfrecord_dataset(
            config,
            batch_size=2,
            seed=0,
            process_index=0,
            process_count=1,
            split=split,
            start_batch=0,
        )
        return list(pipeline.numpy_batches(dataset.take(3), config, split))

    def check(contents):
        with open(path, "wb") as f:
            f.write(contents)
        for read in (
            lambda: tfrecords.check_tfrecords(config),
            lambda: batches("train"),
            lambda: batches("eval"),
        ):
            try:
                read()
            except DataError as e:
                check_one_line(e, path)

    fuzz(
        record_property,
        "TFRecords (check_tfrecords, tfrecord_dataset)",
        tfrecord_files(),
        check,
        max_examples=24,
    )


# ---- The inputs that failed before the readers were fixed, kept as plain regression tests.

_SPECIALS = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n"


@pytest.mark.parametrize(
    "contents, message",
    [
        (_SPECIALS + "the\n\x00\n", "line 7 has a NUL character"),  # darts RuntimeError
        (_SPECIALS + "x" * 300 + "\n", "cannot build the WordPiece model (Vocab token"),
        (_SPECIALS, "cannot build the WordPiece model (No valid vocab tokens"),
        (None, "a directory, expected a file"),  # tf.errors.FailedPreconditionError
    ],
    ids=["NUL token", "long token", "only special tokens", "directory"],
)
def test_vocab_regressions(tmp_path, contents, message):
    path = tmp_path / "vocab.txt"
    path.mkdir() if contents is None else path.write_text(contents)
    with pytest.raises(tokenization.TokenizerError, match=re.escape(message)) as error:
        tokenization.create_tokenizer("wordpiece", str(path), True)
    check_one_line(error.value, path)


def test_corrupt_gzip_data_is_a_data_error(tmp_path):
    """A gzip header then junk: zlib.error, which is neither OSError nor EOFError."""
    path = _write(tmp_path, "corpus.txt.gz", b"\x1f\x8b\x08\x00junkjunk")
    for read in (instances.check_utf8, lambda p: work_units.work_units([p], 64)):
        with pytest.raises(DataError, match="invalid") as error:
            read(path)
        check_one_line(error.value, path)


def _retyped(name: str, kind: str) -> bytes:
    example = tf.train.Example.FromString(_valid_record(0))
    example.features.feature[name].CopyFrom(_feature(kind, int(SPEC[name].shape[0])))
    return example.SerializeToString(deterministic=True)


@pytest.mark.parametrize(
    "contents, message",
    [
        (_framed([b"\x08\x96\x01junk"]), "the first record is not a tf.train.Example"),
        (
            _framed([_retyped("masked_lm_weights", "int64")]),
            "feature 'masked_lm_weights' is int64_list, expected float_list",
        ),
        (
            _framed([_retyped("next_sentence_labels", "bytes")]),
            "is bytes_list, expected int64_list",
        ),
        (VALID_TFRECORDS[:-5], "cannot read a record (truncated record at 450"),
        (_framed([_valid_record(0), _retyped("segment_ids", "float")]), "cannot read a record"),
    ],
    ids=["junk record", "float as int", "bytes as int", "truncated", "second record retyped"],
)
def test_tfrecord_regressions(tmp_path, contents, message):
    path = _write(tmp_path, "part-0.tfrecord", contents)
    config = _tfrecord_config(path)
    with pytest.raises(DataError, match=re.escape(message)) as error:
        tfrecords.check_tfrecords(config)
        dataset = tfrecords.tfrecord_dataset(
            config,
            batch_size=2,
            seed=0,
            process_index=0,
            process_count=1,
            split="eval",
            start_batch=0,
        )
        list(pipeline.numpy_batches(dataset, config, "eval"))
    check_one_line(error.value, path)
