"""``create_pretraining_data --runner=DirectRunner`` (``bertjax.data.offline_beam``) writes the very
bytes ``--runner=local`` writes: unpacked in one process, and packed with two worker processes
(Beam's multi-processing DirectRunner, its options after ``--`` on the real command line); it
prints the same statistics; bad runners, a runner that cannot start, a worker's input error and a
missing Beam are one-line errors."""

import pathlib
import subprocess
import sys

import pytest

from bertjax.data import bundled
from tests.data import offline_test

corpus = offline_test.corpus  # the fixture
_run = offline_test._run  # the command in-process

REPO = pathlib.Path(__file__).parents[2]
# Beam 2.77's DirectRunner first tries Prism, whose binary it downloads from GitHub; a local path
# that does not exist keeps the tests hermetic: it falls back to its Python runner at once.
NO_PRISM = "--prism_location=/nonexistent/prism"
TWO_WORKERS = ["--direct_num_workers=2", "--direct_running_mode=multi_processing", NO_PRISM]


def _argv(corpus, out, *more):
    return [
        f"--input_file={corpus}", f"--output_file={out}", "--num_output_shards=3",
        f"--vocab_file={bundled.VOCAB}", "--max_seq_length=96", "--max_predictions_per_seq=14",
        "--dupe_factor=2", "--random_seed=3", "--work_unit_bytes=30000", *more,
    ]  # fmt: skip


def _shards(out):
    return {p.name: p.read_bytes() for p in sorted(out.parent.glob(out.name + "-*"))}


def _run_command(argv) -> str:
    """``python -m bertjax.create_pretraining_data argv`` -> its stdout."""
    command = [sys.executable, "-m", "bertjax.create_pretraining_data", *argv]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.parametrize(
    "more, two_workers",
    [([], False), (["--pack_sequences", "--max_sequences_per_pack=3"], True)],
    ids=["unpacked-in-process", "packed-two-workers"],
)
def test_direct_runner_writes_the_local_bytes(corpus, tmp_path, capsys, more, two_workers):
    local, beam = tmp_path / "local" / "train.tfrecord", tmp_path / "beam" / "train.tfrecord"
    assert _run(_argv(corpus, local, "--num_workers=1", *more)) == 0
    local_out = capsys.readouterr().out
    if two_workers:  # the real command line, Beam's options after --
        beam_out = _run_command(
            _argv(corpus, beam, "--runner=DirectRunner", *more, "--", *TWO_WORKERS)
        )
        assert f"Beam: --runner=DirectRunner {' '.join(TWO_WORKERS)}\n" in beam_out
    else:
        options = f"--beam_pipeline_options={NO_PRISM}"
        assert _run(_argv(corpus, beam, "--runner=DirectRunner", options, *more)) == 0
        beam_out = capsys.readouterr().out
    want, got = _shards(local), _shards(beam)
    assert len(want) == 3 and all(want.values())
    assert got == want  # byte for byte, shard by shard
    summary = lambda text: text[text.index("examples") :]  # after the "wrote ..." line
    assert summary(beam_out) == summary(local_out)
    assert not list(beam.parent.glob("*beam-scratch*"))  # the scratch is gone


def test_bad_runner_and_options_are_one_line_errors(corpus, tmp_path, capsys):
    out = tmp_path / "x.tfrecord"
    assert _run(_argv(corpus, out, "--runner=Nope")) == 1
    assert "--runner='Nope': expected 'local' or a Beam runner" in capsys.readouterr().err
    assert _run(_argv(corpus, out, "--beam_pipeline_options=--x=1")) == 1
    assert "only for a Beam --runner" in capsys.readouterr().err
    assert _run(_argv(corpus, out, "--runner=DirectRunner", "--beam_pipeline_options='a")) == 1
    assert '--beam_pipeline_options="\'a": No closing quotation' in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
    # A runner that cannot start (here Prism without its binary) is one line too.
    assert (
        _run(_argv(corpus, out, "--runner=PrismRunner", f"--beam_pipeline_options={NO_PRISM}")) == 1
    )
    err = capsys.readouterr().err
    assert err.startswith("create_pretraining_data: error: --runner=PrismRunner could not start: ")
    assert "/nonexistent/prism" in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())
    bad = tmp_path / "bad.txt"  # an input error inside a worker: the same one line as locally
    bad.write_bytes(b"One document.\nTwo lines.\n\nAnother \xff one.\n\nA third.\n")
    options = f"--beam_pipeline_options={NO_PRISM}"
    assert _run(_argv(bad, out, "--runner=DirectRunner", options)) == 1
    assert (
        capsys.readouterr().err
        == f"create_pretraining_data: error: {bad}: not UTF-8 text (byte 34)\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt"]


def test_without_beam_the_runner_says_how_to_install(corpus, tmp_path):
    script = (
        "import sys; sys.modules['apache_beam'] = None\n"
        "from absl import flags\n"
        "from bertjax import cli, create_pretraining_data as c\n"
        "v = flags.FlagValues(); c.define_flags(v)\n"
        f"v(['x', *{_argv(corpus, tmp_path / 'y.tfrecord', '--runner=DirectRunner')!r}])\n"
        "sys.exit(cli.call(c.run, v, prog='create_pretraining_data'))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 1
    assert "pip install 'bertjax[beam]'" in result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("how", ["delete", "truncate"])
def test_a_lost_or_short_piece_is_one_line_and_no_output(
    corpus, tmp_path, capsys, monkeypatch, how
):
    """As ``--runner=local`` (offline_test): a piece damaged after the units are written, before
    its shard is concatenated, is the one line naming it; no shard, and the scratch is gone."""
    damage = offline_test.Damage(monkeypatch, how)
    out = tmp_path / "out" / "train.tfrecord"
    options = f"--beam_pipeline_options={NO_PRISM}"
    assert _run(_argv(corpus, out, "--runner=DirectRunner", options)) == 1
    assert ".beam-scratch-" in damage.path
    assert capsys.readouterr().err == damage.message()
    assert list(out.parent.iterdir()) == []  # no shard, no scratch
