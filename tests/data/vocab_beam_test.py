"""``bertjax.vocab --runner=DirectRunner`` (``bertjax.data.vocab_beam``) builds the vocab that
``--runner=local`` builds, byte for byte: WordPiece from word counts summed over several work units
(Beam's worker processes are tested with the offline builder, tests/data/offline_beam_test.py),
SentencePiece from the same sentence sample; a worker's input error is the command's one line."""

import pytest

from bertjax.data import vocab, vocab_beam
from tests.data import vocab_test
from tests.data.offline_beam_test import NO_PRISM

corpus = vocab_test.corpus  # the fixture
_run_main = vocab_test._run_main  # the command in-process


@pytest.fixture
def small_units(monkeypatch):
    """Units of 20 kB: the 150 kB corpus is read as several, by different workers."""
    monkeypatch.setattr(vocab_beam, "UNIT_BYTES", 20_000)


@pytest.mark.parametrize("kind", ["wordpiece", "sentencepiece"])
def test_direct_runner_builds_the_local_vocab(corpus, tmp_path, capsys, small_units, kind):
    size = ["--vocab_size=900", "--num_unused=2"] if kind == "wordpiece" else ["--vocab_size=500"]
    argv = [f"--input_file={corpus[0]}", f"--type={kind}", "--do_lower_case=false", *size]
    local, beam = tmp_path / "local.vocab", tmp_path / "beam.vocab"
    code, _, err = _run_main(capsys, [*argv, f"--output_file={local}"])
    assert code == 0, err
    runner = ["--runner=DirectRunner", f"--beam_pipeline_options={NO_PRISM}"]
    code, out, err = _run_main(capsys, [*argv, *runner, f"--output_file={beam}"])
    assert code == 0, err
    assert out.startswith(f"Beam: --runner=DirectRunner {NO_PRISM}\n")
    assert len(local.read_bytes()) > 2000
    assert beam.read_bytes() == local.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["beam.vocab", "local.vocab"]


def test_a_workers_input_error_is_one_line(tmp_path, capsys):
    (tmp_path / "in.txt").write_bytes(b"ok words\n\nmore\n\xff\xfe bad\n")
    argv = [f"--input_file={tmp_path}/in.txt", f"--output_file={tmp_path}/v.txt", "--vocab_size=99"]
    options = ["--runner=DirectRunner", f"--beam_pipeline_options={NO_PRISM}"]
    code, _, err = _run_main(capsys, [*argv, *options])
    assert code == 1
    assert err == f"vocab: error: {tmp_path}/in.txt: not UTF-8 text (byte 15)\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_the_learner_gets_only_what_it_uses_and_the_local_input(
    corpus, tmp_path, small_units, monkeypatch
):
    """With the learner's caps met (vocab_test.learner_limits), Beam's workers send back the
    ``MAX_INPUT_TOKENS`` words that ``vocab.learner_input`` keeps here, not every distinct word."""
    vocab_test.learner_limits(monkeypatch, 400, 40)
    files = vocab.expand_globs(corpus[0])
    counts = vocab.count_words(files, do_lower_case=True)
    local = vocab.learner_input(counts, num_unused=3)
    beam = vocab_beam.learner_input(
        files, True, 3, str(tmp_path / "vocab.txt"), "DirectRunner", NO_PRISM
    )
    assert len(beam.words) == 400 < len(counts)
    assert sorted(beam.words) == sorted(local.words)
    assert (beam.lowest, beam.highest) == (local.lowest, local.highest) == (1, max(counts.values()))
    assert list(tmp_path.iterdir()) == []  # the scratch is gone
