"""Bad flags and config files in every command that takes ``--config``: one line
``<command>: error: <message>`` on stderr, exit status 1, nothing written (``bertjax.cli``).

The real commands run in an empty directory each, all of them in one subprocess
(:data:`PROBE`, each run its module run as ``__main__`` by ``tests.commands.in_process``, as
``python -m`` runs it): each fails while absl parses its flags, before TensorFlow is
imported or JAX computes anything. One process instead of one per case saves a start-up each
(~40 of them).
"""

import dataclasses
import json
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


PROBE = """
import json, os, sys
from tests.commands.in_process import run_module
runs, results_path = json.load(open(sys.argv[1])), sys.argv[2]
results = []
for run in runs:
    saved = dict(os.environ)
    os.environ.update(run["env"])
    os.chdir(run["cwd"])
    done = run_module(run["module"], *run["argv"], process_setup=True)
    os.environ.clear()
    os.environ.update(saved)
    results.append({"code": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
                    "tensorflow": "tensorflow" in sys.modules})
json.dump(results, open(results_path, "w"))
"""


@dataclasses.dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str
    tensorflow: bool


class Runs:
    """Every command run of this module, in one subprocess: ``add`` them all, then ``result``."""

    def __init__(self, root: pathlib.Path):
        self.root, self.runs, self.results = root, [], None
        self.configs = root / "configs"
        self.configs.mkdir()
        for name, text in CONFIG_FILES.items():
            (self.configs / name).write_text(text)

    def add(self, name: str, module: str, argv_of, **env) -> None:
        """``argv_of(configs, run)``: the arguments, given the config files' directory and the
        empty directory the run gets."""
        run = self.root / f"run-{len(self.runs)}"
        run.mkdir()
        argv = argv_of(self.configs, run)
        self.runs.append({"name": name, "module": module, "argv": argv, "cwd": str(run),
                          "env": env})  # fmt: skip

    def result(self, name: str) -> tuple[Result, pathlib.Path]:
        if self.results is None:
            plan, out = self.root / "runs.json", self.root / "results.json"
            plan.write_text(json.dumps(self.runs))
            command = [sys.executable, "-c", PROBE, str(plan), str(out)]
            done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
            assert done.returncode == 0, done.stderr[-3000:]
            self.results = dict(zip([r["name"] for r in self.runs],
                                    json.loads(out.read_text()), strict=True))  # fmt: skip
        run = next(r for r in self.runs if r["name"] == name)
        values = {("returncode" if k == "code" else k): v for k, v in self.results[name].items()}
        return Result(**values), pathlib.Path(run["cwd"])


BAD_INPUTS = [
    (prog, case)
    for prog, command in COMMANDS.items()
    for case in CASES
    if command.required or case != "missing_required"
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    runs = Runs(tmp_path_factory.mktemp("cli"))
    for prog, case in BAD_INPUTS:
        command = COMMANDS[prog]
        argv_of = lambda configs, run, c=case, m=command: _case(c, m, configs, run / "workdir")[0]
        runs.add(f"{prog}-{case}", command.module, argv_of)
    two_phase = REPO / "configs" / "two_phase.py"
    runs.add("two_phase", "bertjax.main",
             lambda _, run: [f"--config={two_phase}:base,3", f"--workdir={run / 'w'}"])  # fmt: skip
    runs.add("missing_behind_override", "bertjax.main",
             lambda _, run: ["--config=nope.py", f"--workdir={run / 'w'}",
                             "--config.train.num_steps=3"])  # fmt: skip
    tiny = REPO / "configs" / "tiny.py"
    runs.add("traceback", "bertjax.main",
             lambda _, run: [f"--config={tiny}", f"--workdir={run / 'w'}",
                             "--config.train.num_stepz=5"], BERTJAX_TRACEBACK="1")  # fmt: skip
    for bug in ("zero_division", "key_error"):
        argv_of = lambda configs, run, b=bug: [
            f"--config={configs / b}.py",
            f"--workdir={run / 'w'}",
            "--config.train.num_steps=3",
        ]
        runs.add(bug, "bertjax.main", argv_of)  # fmt: skip
    return runs


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


def _assert_one_line(result, prog: str, texts: list[str]) -> None:
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    for text in texts:
        assert text in lines[0]


@pytest.mark.parametrize("prog,case", BAD_INPUTS)
def test_bad_input_is_one_line_and_writes_nothing(prog, case, runs):
    result, run = runs.result(f"{prog}-{case}")
    _, texts = _case(case, COMMANDS[prog], runs.configs, run / "workdir")
    _assert_one_line(result, prog, texts)
    assert not list(run.iterdir())  # no workdir, nothing else
    assert not result.tensorflow  # failed while parsing its flags: nothing heavy imported


def test_a_repository_config_that_rejects_its_argument(runs):
    result, run = runs.result("two_phase")
    _assert_one_line(result, "main", ["two_phase.py:base,3", "phase must be 1 or 2, got '3'"])
    assert not list(run.iterdir())


def test_missing_file_behind_an_override(runs):
    """ml_collections raises the load error while applying the override, not later."""
    result, run = runs.result("missing_behind_override")
    _assert_one_line(result, "main", ["--config=nope.py", "No such file", str(run)])


def test_traceback_on_request(runs):
    result, run = runs.result("traceback")
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert 'Did you mean "num_steps"' in result.stderr
    assert not list(run.iterdir())


@pytest.mark.parametrize("bug", ["zero_division", "key_error"])
def test_a_bug_in_a_config_file_keeps_its_traceback(bug, runs):
    result, _ = runs.result(bug)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert f"{bug}.py" in result.stderr and "main: error:" not in result.stderr


def test_help_answers_without_tensorflow(tmp_path):
    """A process of its own: Python's import profile of a fresh start."""
    result = _run("bertjax.main", ["--helpfull"], tmp_path, PYTHONPROFILEIMPORTTIME="1")
    assert "--workdir" in result.stdout and "--config" in result.stdout
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines()}
    assert "bertjax.cli" in imported and "tensorflow" not in imported


def test_a_sigterm_while_the_flags_are_defined_is_one_line(capsys):
    """ml_collections reads argv while a config flag is defined: a SIGTERM can land there, after
    cli.run's handler is installed (faults_test's start-up case caught it once as a traceback)."""
    import signal  # noqa: PLC0415

    from bertjax import cli  # noqa: PLC0415

    previous = signal.getsignal(signal.SIGTERM)

    def define_flags():
        os.kill(os.getpid(), signal.SIGTERM)  # delivered here, inside the definition

    try:
        with pytest.raises(SystemExit) as stopped:
            cli.run(lambda _: 0, define_flags, prog="x", tensorflow=False)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stopped.value.code == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["x: stopped by SIGTERM before anything was saved"]
