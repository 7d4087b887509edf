"""List-valued ``config.data`` fields: config-file lists and command-line comma strings."""

import pathlib

import pytest
from absl import flags
from ml_collections import config_flags

from bertjax.data import pipeline, sources
from bertjax.data.instances import DataError
from tests.commands import in_process

REPO = pathlib.Path(__file__).parents[2]


def _parse(*overrides):
    """``configs/base.py`` with overrides, parsed like ``bertjax.main`` parses its flags."""
    argv = ["main", f"--config={REPO / 'configs' / 'base.py'}", *overrides]
    values = flags.FlagValues()  # private: never touches the global flags of other tests
    config_flags.DEFINE_config_file(
        "config", None, "", flag_values=values, lock_config=True, sys_argv=argv
    )
    values(argv)
    return values.config


@pytest.fixture
def files(tmp_path):
    for name in ("a.txt", "b/x.txt", "b/y.txt", "c.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x\n")
    return tmp_path


def test_comma_separated_override_from_the_command_line(files):
    config = _parse(f"--config.data.input_files={files}/a.txt,{files}/b/*.txt")
    got = sources.resolve_files(config.data.input_files, "input_files")
    assert got == [str(files / n) for n in ("a.txt", "b/x.txt", "b/y.txt")]
    config = _parse(f"--config.data.eval_input_files={files}/c.txt")  # a single glob
    assert sources.resolve_files(config.data.eval_input_files, "eval_input_files") == [
        str(files / "c.txt")
    ]
    # Python-literal lists still work, and a config file may assign a list or a tuple.
    config = _parse(f"--config.data.input_files=['{files}/a.txt', '{files}/c.txt']")
    assert len(sources.resolve_files(config.data.input_files, "input_files")) == 2
    config.data.input_files = (f"{files}/b/*.txt",)
    assert len(sources.resolve_files(config.data.input_files, "input_files")) == 2


@pytest.mark.parametrize(
    "value,message",
    [
        ("5", "data.input_files=5: expected a glob, comma-separated globs or a list of globs"),
        ("[1, 2]", r"data.input_files=\[1, 2\]: expected a glob"),
        (",", "data.input_files=',': no file pattern given"),
    ],
)
def test_wrong_type_is_a_clear_error(value, message):
    config = _parse(f"--config.data.input_files={value}")
    with pytest.raises(DataError, match=message):
        pipeline.check_data_config(config.data)


def test_main_splits_the_comma_list(tmp_path):
    """The real entry point (``python -m bertjax.main``, run in this process as ``-m`` runs it:
    ``tests.commands.in_process``): the override reaches the data config as two globs."""
    override = f"--config.data.input_files={tmp_path}/none-1/*.txt,{tmp_path}/none-2/*.txt"
    result = in_process.run_module(
        "bertjax.main",
        f"--config={REPO}/configs/tiny.py",
        override,
        f"--workdir={tmp_path / 'work'}",
    )
    assert result.returncode == 1
    expected = f"['{tmp_path}/none-1/*.txt', '{tmp_path}/none-2/*.txt']: no file matches"
    assert f"error: data.input_files={expected}" in result.stderr
