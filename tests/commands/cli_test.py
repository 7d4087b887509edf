"""Bad flags and config files in every command that takes ``--config``: one line
``<command>: error: <message>`` on stderr, exit status 1, nothing written (``bertjax.cli``).

The real commands run as subprocesses in an empty directory; each fails while absl parses its
flags, before TensorFlow is imported or JAX computes anything: a run costs the start and the
config file's imports.
"""

import dataclasses
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).parents[2]


@dataclasses.dataclass(frozen=True)
class Command:
    module: str
    config: str  # a real config file under configs/
    required: tuple[str, ...]  # the other required flags; {workdir} is filled in
    typo: str  # a near miss of the key `fix`
    fix: str
    key: str  # an int-valued key of `config`


COMMANDS = {
    "main": Command(
        "bertjax.main", "tiny.py", ("--workdir={workdir}",),
        "train.num_stepz", "train.num_steps", "train.num_steps",
    ),
    "finetune": Command(
        "bertjax.finetune", "finetune_glue.py", ("--workdir={workdir}",),
        "train.num_epochz", "train.num_epochs", "train.global_batch_size",
    ),
    "compile": Command(
        "bertjax.compile", "tiny.py", ("--topology=v5litepod-4",),
        "model.num_layerz", "model.num_layers", "model.num_layers",
    ),
    "data_stats": Command(
        "bertjax.data_stats", "base.py", (),
        "data.max_seq_lenght", "data.max_seq_length", "data.max_seq_length",
    ),
}  # fmt: skip
CASES = (
    "unknown_key",
    "missing_file",
    "get_config_raises",
    "syntax_error",
    "wrong_type",
    "missing_required",
    "unknown_flag",
    "positional",
)
CONFIG_FILES = {
    "raises.py": (
        "def get_config(size):\n    raise ValueError(f'size must be base or large, got {size!r}')\n"
    ),
    "syntax.py": "def get_config():\n    return dict(a=1,\n\n",
    "zero_division.py": "def get_config():\n    return 1 / 0\n",
    "key_error.py": "def get_config():\n    return {'num_steps': 5}['num_stepz']\n",
}


@pytest.fixture
def dirs(tmp_path):
    """(configs, run): config files of the tests, and the empty directory the command runs in."""
    configs, run = tmp_path / "configs", tmp_path / "run"
    configs.mkdir()
    run.mkdir()
    for name, text in CONFIG_FILES.items():
        (configs / name).write_text(text)
    return configs, run


def _case(name: str, command: Command, configs: pathlib.Path, workdir: pathlib.Path):
    """(argv, texts the error line must contain) of one bad input."""
    required = [flag.format(workdir=workdir) for flag in command.required]
    flag = command.required[0].split("=")[0] if command.required else ""
    good = [f"--config={REPO / 'configs' / command.config}", *required]
    return {
        "unknown_key": (
            [*good, f"--config.{command.typo}=5"],
            [f"--config.{command.typo}", command.config, f"did you mean {command.fix}?"],
        ),
        "missing_file": (
            ["--config=configs/nope.py", *required],
            ["--config=configs/nope.py", "No such file"],
        ),
        "get_config_raises": (
            [f"--config={configs / 'raises.py'}:huge", *required],
            ["raises.py:huge", "size must be base or large, got 'huge'"],
        ),
        "syntax_error": (
            [f"--config={configs / 'syntax.py'}", *required],
            ["syntax.py", "not valid Python", "line 2"],
        ),
        "wrong_type": ([*good, f"--config.{command.key}=abc"], [f"{command.key}=abc", "int"]),
        "missing_required": (good[:1] + required[1:], [f"{flag} is required"]),
        "unknown_flag": ([*good, "--nope"], ["'nope'"]),
        "positional": ([*good, "extra"], ["unexpected arguments extra"]),
    }[name]


def _run(module: str, argv: list[str], cwd: pathlib.Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *argv],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _assert_one_line(result: subprocess.CompletedProcess, prog: str, texts: list[str]) -> None:
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    for text in texts:
        assert text in lines[0]


@pytest.mark.parametrize(
    "prog,case",
    [
        (prog, case)
        for prog, command in COMMANDS.items()
        for case in CASES
        if command.required or case != "missing_required"
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(prog, case, dirs):
    configs, run = dirs
    command = COMMANDS[prog]
    argv, texts = _case(case, command, configs, run / "workdir")
    _assert_one_line(_run(command.module, argv, run), prog, texts)
    assert not list(run.iterdir())  # no workdir, nothing else


def test_a_repository_config_that_rejects_its_argument(dirs):
    _, run = dirs
    config = REPO / "configs" / "two_phase.py"
    result = _run("bertjax.main", [f"--config={config}:base,3", f"--workdir={run / 'w'}"], run)
    _assert_one_line(result, "main", ["two_phase.py:base,3", "phase must be 1 or 2, got '3'"])
    assert not list(run.iterdir())


def test_missing_file_behind_an_override(dirs):
    """ml_collections raises the load error while applying the override, not later."""
    _, run = dirs
    argv = ["--config=nope.py", f"--workdir={run / 'w'}", "--config.train.num_steps=3"]
    result = _run("bertjax.main", argv, run)
    _assert_one_line(result, "main", ["--config=nope.py", "No such file", str(run)])


def test_traceback_on_request(dirs):
    _, run = dirs
    argv = [f"--config={REPO / 'configs' / 'tiny.py'}", f"--workdir={run / 'w'}"]
    result = _run("bertjax.main", [*argv, "--config.train.num_stepz=5"], run, BERTJAX_TRACEBACK="1")
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert 'Did you mean "num_steps"' in result.stderr
    assert not list(run.iterdir())


@pytest.mark.parametrize("bug", ["zero_division", "key_error"])
def test_a_bug_in_a_config_file_keeps_its_traceback(bug, dirs):
    configs, run = dirs
    argv = [f"--config={configs / bug}.py", f"--workdir={run / 'w'}", "--config.train.num_steps=3"]
    result = _run("bertjax.main", argv, run)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert f"{bug}.py" in result.stderr and "main: error:" not in result.stderr


def test_help_answers_without_tensorflow(dirs):
    _, run = dirs
    result = _run("bertjax.main", ["--helpfull"], run, PYTHONPROFILEIMPORTTIME="1")
    assert "--workdir" in result.stdout and "--config" in result.stdout
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines()}
    assert "bertjax.cli" in imported and "tensorflow" not in imported
