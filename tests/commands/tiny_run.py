"""The tiny pretraining run the command tests share: ``python -m bertjax.main`` on 40 chapters of
the bundled corpus (8 steps, a checkpoint every 2, evaluation every 4), and its one
uninterrupted reference run, made once per test session however many xdist workers ask.

``main_test``, ``faults_test`` and the ``gs://`` pretraining tests drive the same command; the
reference (a workdir, its stdout and stderr) is what their interrupted, damaged or remote runs
must end bit-identical to. :func:`shared` builds it under a file lock in the directory every
worker of the session shares; a worker that finds it built reuses it. Tests copy the reference
workdir before they change anything in it. The reference runs in a fresh process (main_test
reads its start-up output); the other runs fork from the suite's zygote (``tests/zygote.py``:
the same command in a process of its own, its imports done once).

A run refused before its devices compute anything (a bad config, a workdir in use, a vocab or
model that does not fit, no checkpoint that verifies) is checked in the test's own process with
:func:`call`: the command's flags and its ``_train`` under ``bertjax.cli.call``, as
``bertjax.main`` runs them, without a start-up of its own (about 8 s of CPU each).
"""

from __future__ import annotations

import dataclasses
import gzip
import pathlib
import subprocess
import sys

import filelock

from bertjax.data import bundled
from tests import cpu_xla, zygote
from tests.commands import in_process
from tests.pretrain.step_test import TINY_MODEL

REPO = pathlib.Path(__file__).parents[2]
NUM_STEPS = 8


def overrides(corpus: pathlib.Path) -> list[str]:
    values = {
        **{f"model.{k}": v for k, v in TINY_MODEL.items()},
        "data.cache_dir": str(corpus.parent / "cache"),
        "data.max_seq_length": 32,
        "data.max_predictions_per_seq": 5,
        "train.num_steps": NUM_STEPS,
        "train.global_batch_size": 8,
        "train.log_every": 1,
        "train.eval_every": 4,
        "train.eval_steps": 2,
        "train.eval_batch_size": 8,
        "checkpoint.every_steps": 2,
        "optimizer.warmup_steps": 2,
    }
    return [f"--config.{k}={v}" for k, v in values.items()]


def command(corpus: pathlib.Path, workdir, *extra) -> list[str]:
    return [sys.executable, "-m", "bertjax.main", f"--config={corpus.parent / 'test_config.py'}",
            f"--workdir={workdir}", *overrides(corpus), *extra]  # fmt: skip


def run(env, workdir, *extra, timeout=300, fresh=False) -> subprocess.CompletedProcess:
    """The command in a process forked from this process's zygote (``tests/zygote.py``), or,
    with ``fresh``, started from scratch (its start-up output is the point)."""
    _, corpus, environ = env
    launch = subprocess.run if fresh else zygote.run
    return launch(command(corpus, workdir, *extra), env=environ, cwd=REPO,
                  capture_output=True, text=True, timeout=timeout)  # fmt: skip


def call(env, workdir, *extra) -> subprocess.CompletedProcess:
    """:func:`run`'s command in this process (``tests.commands.in_process``), for a run whose
    own process is not the point: one that stops with an error before its devices compute, or a
    short one with something patched in. The devices are this process's (8 fake CPU devices)."""
    argv = command(env[1], workdir, *extra)[2:]
    return in_process.run_module(*argv)


def environ(root: pathlib.Path, *, platform_hints: bool = False) -> dict:
    """The subprocesses' environment: one device, XLA at -O0 and a compilation cache under
    ``root`` that keeps every compile. ``platform_hints``: keep the caller's ``JAX_PLATFORMS``
    and ``TF_CPP_MIN_LOG_LEVEL`` (by default dropped: the quiet start is bertjax's own,
    ``bertjax.startup``, not the test's)."""
    environ = cpu_xla.environ(
        1,
        JAX_COMPILATION_CACHE_DIR=str(root / "jax_cache"),
    )
    if not platform_hints:
        for name in ("JAX_PLATFORMS", "TF_CPP_MIN_LOG_LEVEL"):
            environ.pop(name, None)
    return environ


def write_env(root: pathlib.Path, *, cache_dir: pathlib.Path | None = None) -> pathlib.Path:
    """Writes ``root/corpus.txt`` (40 chapters of the bundled corpus: enough documents for NSP,
    quick to tokenize) and ``root/test_config.py`` (tiny.py reading it; with ``cache_dir``, its
    data cache there); returns the corpus."""
    with gzip.open(bundled.bundled_paths().train, "rt", encoding="utf-8") as f:
        chapters = f.read().split("\n\n")[:40]
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(chapters) + "\n", encoding="utf-8")
    cache = f"    config.data.cache_dir = {str(cache_dir)!r}\n" if cache_dir else ""
    # List-valued fields cannot be overridden on the command line: a config file sets them.
    (root / "test_config.py").write_text(
        f"import sys\nsys.path.insert(0, {str(REPO / 'configs')!r})\nimport tiny\n\n\n"
        f"def get_config():\n    config = tiny.get_config()\n"
        f"    config.data.input_files = config.data.eval_input_files = [{str(corpus)!r}]\n"
        f"{cache}    return config\n"
    )
    return corpus


@dataclasses.dataclass(frozen=True)
class Shared:
    env: tuple  # (root, corpus, environ): what ``run`` and ``command`` take
    reference: tuple  # (workdir, stdout, stderr) of the uninterrupted run


def shared(session_root: pathlib.Path) -> Shared:
    """The env and the reference run under ``session_root`` (shared by the session's workers),
    built by the first caller, under a file lock; later callers read what it wrote."""
    root = session_root / "tiny_run"
    with filelock.FileLock(str(session_root / "tiny_run.lock")):
        done = root / "reference.done"
        if not done.exists():
            root.mkdir(exist_ok=True)
            write_env(root)
            env = (root, root / "corpus.txt", environ(root))
            result = run(env, root / "reference", fresh=True)  # main_test reads its start-up
            if result.returncode != 0:
                raise AssertionError(f"the reference run failed: {result.stderr[-3000:]}")
            (root / "reference.stdout").write_text(result.stdout)
            (root / "reference.stderr").write_text(result.stderr)
            done.touch()
    env = (root, root / "corpus.txt", environ(root))
    reference = (root / "reference", (root / "reference.stdout").read_text(),
                 (root / "reference.stderr").read_text())  # fmt: skip
    return Shared(env, reference)
