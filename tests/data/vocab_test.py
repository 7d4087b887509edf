"""bertjax.vocab: WordPiece vocab building and SentencePiece training, through the real CLI.

References: HF ``BertTokenizerFast`` on the built vocab (ids and the words its normaliser and
pre-tokenizer produce) and the ``sentencepiece`` processor itself for the trained model.
"""

import gzip
import pathlib

import pytest
import sentencepiece as spm
import tensorflow as tf
from absl import flags
from transformers import BertTokenizerFast

from bertjax import cli
from bertjax import vocab as vocab_cli
from bertjax.data import tokenization
from bertjax.data import vocab as vocab_lib
from tests.commands import in_process

CORPUS_BYTES = 150_000


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[str, list[str]]:
    """(--input_file value, lines): Python's pydoc topics, one plain and one gzip'd file."""
    import pydoc_data.topics

    text = "\n".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))
    lines = text.encode("utf-8")[:CORPUS_BYTES].decode("utf-8", "ignore").split("\n")
    directory = tmp_path_factory.mktemp("corpus")
    half = len(lines) // 2
    (directory / "part1.txt").write_text("\n".join(lines[:half]) + "\n", encoding="utf-8")
    with gzip.open(directory / "part2.txt.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(lines[half:]) + "\n")
    return f"{directory}/part1.txt,{directory}/*.gz", lines


@pytest.fixture(scope="module")
def uncased_vocab(corpus, tmp_path_factory) -> pathlib.Path:
    """A WordPiece vocab built by the real entry point, ``python -m bertjax.vocab`` (run in this
    process as ``-m`` runs it, absl parsing the flags: ``tests.commands.in_process``)."""
    output = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    result = in_process.run_module(
        "bertjax.vocab",
        f"--input_file={corpus[0]}",
        f"--output_file={output}",
        "--vocab_size=1000",
        "--num_unused=3",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return output


def test_wordpiece_vocab_size_and_special_tokens(uncased_vocab):
    tokens = uncased_vocab.read_text("utf-8").split("\n")[:-1]
    assert 800 <= len(tokens) <= 1000
    assert tokens[:8] == [*tokenization.SPECIAL_TOKENS, "[unused0]", "[unused1]", "[unused2]"]
    assert len(set(tokens)) == len(tokens)
    assert all(t == t.lower() for t in tokens[8:])  # uncased


def test_wordpiece_vocab_round_trip(uncased_vocab, corpus):
    lines = corpus[1]
    ours = tokenization.WordPieceTokenizer(str(uncased_vocab), do_lower_case=True)
    reference = BertTokenizerFast(vocab_file=str(uncased_vocab), do_lower_case=True)
    ids = ours.encode(lines)
    assert ids == reference(lines, add_special_tokens=False)["input_ids"]
    total = sum(len(row) for row in ids)
    unknown = sum(row.count(ours.unk_id) for row in ids)
    assert unknown / total < 0.001, f"[UNK] rate {unknown}/{total} on the training corpus"
    # Joining each word's pieces gives back the reference's normalised words.
    backend = reference.backend_tokenizer
    words = tokenization.WordPieceTokenizer.tokenize_words(ours, tf.constant(lines[:300]))
    for line, row in zip(lines[:300], words.to_list(), strict=True):
        expected = [
            w
            for w, _ in backend.pre_tokenizer.pre_tokenize_str(
                backend.normalizer.normalize_str(line)
            )
        ]
        pieces = [ours.convert_ids_to_tokens(word) for word in row]
        joined = [p[0] + "".join(q.removeprefix("##") for q in p[1:]) for p in pieces]
        assert [j for j, p in zip(joined, row, strict=True) if ours.unk_id not in p] == [
            e for e, p in zip(expected, row, strict=True) if ours.unk_id not in p
        ]


def test_cased_vocab_keeps_case(corpus, tmp_path):
    files = vocab_lib.expand_globs(corpus[0])
    counts = vocab_lib.count_words(files, do_lower_case=False)
    tokens = vocab_lib.learn_wordpiece(vocab_lib.learner_input(counts, 0), 700, 0, files)
    assert len(tokens) <= 700 and tokens[:5] == list(tokenization.SPECIAL_TOKENS)
    assert any(t != t.lower() for t in tokens[5:])
    path = tmp_path / "cased.txt"
    vocab_lib.write_vocab(tokens, str(path))
    lines = corpus[1][:500]
    ours = tokenization.WordPieceTokenizer(str(path), do_lower_case=False)
    reference = BertTokenizerFast(vocab_file=str(path), do_lower_case=False)
    assert ours.encode(lines) == reference(lines, add_special_tokens=False)["input_ids"]


def learner_limits(monkeypatch, words: int, chars: int) -> None:
    """The learner's caps lowered, so that this small corpus meets them."""
    monkeypatch.setattr(vocab_lib, "MAX_INPUT_TOKENS", words)
    monkeypatch.setattr(vocab_lib, "MAX_UNIQUE_CHARS", chars)


@pytest.mark.parametrize("limits", [None, (400, 40)], ids=["shipped", "caps-met"])
def test_what_the_learner_is_given_makes_its_own_vocab(corpus, monkeypatch, limits):
    """``learner_input`` keeps only what tensorflow-text's learner uses: the vocab is the one
    ``learner.learn`` makes from all the counts (a word too long and a reserved one added;
    with the caps met, the words kept are cut inside a tie and some characters are not in the
    alphabet, and the lowest and highest counts come from words not kept)."""
    from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as learner

    if limits:
        learner_limits(monkeypatch, *limits)
    files = vocab_lib.expand_globs(corpus[0])[:1]  # half the corpus: the learner runs twice
    counts = vocab_lib.count_words(files, do_lower_case=False)
    counts.update({"x" * 51: 10**6, "[unused1]": 50})
    given = vocab_lib.learner_input(counts, num_unused=2)
    reference = learner.learn(
        sorted(counts.items(), key=lambda pair: (-pair[1], pair[0])),  # ties at the cap by word
        700,
        vocab_lib.reserved_tokens(2),
        lower_thresh=1,
        max_unique_chars=vocab_lib.MAX_UNIQUE_CHARS,
        max_token_length=50,
        max_input_tokens=vocab_lib.MAX_INPUT_TOKENS,
    )[:700]
    assert vocab_lib.learn_wordpiece(given, 700, 2, files) == reference
    kept = dict(given.words)
    assert (given.lowest, given.highest) == (1, 10**6) and "x" * 51 not in kept
    if limits:
        assert len(kept) == 400 < len(counts)
        cut = min(kept.values())
        assert any(count == cut and word not in kept for word, count in counts.items())
        assert min(counts.values()) < cut
        alphabet = set("".join(kept))
        assert len(alphabet) <= 40 < len(set("".join(counts)))


def _run_main(capsys, argv: list[str]) -> tuple[int, str, str]:
    """The CLI's flags and run() in-process (saves a TensorFlow start-up per case)."""
    flag_values = flags.FlagValues()
    vocab_cli.define_flags(flag_values)
    flag_values(["vocab", *argv])
    code = cli.call(vocab_cli.run, flag_values, prog="vocab")
    out, err = capsys.readouterr()
    return code, out, err


def test_sentencepiece_model(corpus, tmp_path, capsys):
    model = tmp_path / "sp.model"
    argv = [
        f"--input_file={corpus[0]}",
        f"--output_file={model}",
        "--vocab_size=600",
        "--type=sentencepiece",
        "--do_lower_case=false",
    ]
    code, _, err = _run_main(capsys, argv)
    assert code == 0, err
    ours = tokenization.create_tokenizer("sentencepiece", str(model), do_lower_case=False)
    assert ours.vocab[:5] == list(tokenization.SPECIAL_TOKENS)
    assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id) == (0, 1, 2, 3, 4)
    reference = spm.SentencePieceProcessor(model_file=str(model))
    assert reference.GetPieceSize() == ours.vocab_size <= 600
    lines = corpus[1][:500] + ["[MASK] stays text", ""]
    ids = ours.encode(lines)
    expected = reference.encode(lines)
    # tensorflow-text bundles its own SentencePiece build, which breaks exact Viterbi ties (runs
    # like "=====") differently; such segmentations must still spell the same pieces.
    differ = [i for i, (a, b) in enumerate(zip(ids, expected, strict=True)) if a != b]
    assert len(differ) <= len(lines) // 100, [lines[i] for i in differ]
    for i in differ:
        assert reference.decode(ids[i]) == reference.decode(expected[i])
        assert sorted(ids[i]) == sorted(expected[i]), lines[i]
    assert not any(set(row) & {0, 2, 3, 4} for row in ids)  # control symbols never from text
    words = ours.tokenize_words(tf.constant(lines))
    assert words.merge_dims(1, 2).to_list() == ids
    first = [ours.convert_ids_to_tokens(w)[0] for w in words[0].to_list()]
    assert all(p.startswith("\u2581") for p in first)


@pytest.mark.parametrize(
    "setup, argv, expected",
    [
        (
            None,
            ["--input_file={d}/none*.txt"],
            "--input_file pattern '{d}/none*.txt' matches no file",
        ),
        (b"", ["--input_file={d}/in.txt"], "input files {d}/in.txt: no words (empty corpus)"),
        (b"ok\n\xff\xfe bad\n", ["--input_file={d}/in.txt"], "input file {d}/in.txt: not UTF-8"),
        (b"ok\n", ["--input_file={d}/in.txt", "--vocab_size=5"], "--vocab_size=5 must exceed"),
    ],
)
def test_bad_input_is_one_line_error(tmp_path, capsys, setup, argv, expected):
    if setup is not None:
        (tmp_path / "in.txt").write_bytes(setup)
    output = tmp_path / "vocab.txt"
    argv = [a.format(d=tmp_path) for a in argv]
    if not any(a.startswith("--vocab_size") for a in argv):
        argv.append("--vocab_size=100")
    code, out, err = _run_main(capsys, [*argv, f"--output_file={output}"])
    assert code == 1 and out == ""
    assert err.startswith("vocab: error: " + expected.format(d=tmp_path)) and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if setup is None else ["in.txt"])
