"""Commands run in a Python process that is already up, as ``python -m`` runs them.

A command's start-up costs about 7 CPU s of imports (TensorFlow, JAX, Flax, Orbax). A test whose
point is what a command prints, writes or refuses runs it with :func:`run_module`: in the test
process, or several runs in one subprocess (a ``python -c`` script that imports this module, as
the ``gs://`` tests do inside the emulator's network namespace). A test whose point is a property
of a process (a quiet start-up, TensorFlow never imported, signals, ``kill -9``, the stderr of a
fresh process) starts its own.

The contract of :func:`run_module`:

- the module runs as ``__main__`` (``runpy``, ``alter_sys``) with ``sys.argv = [module, *argv]``,
  so absl parses the flags and ``bertjax.cli`` turns errors into one line, as in a process;
- the exit status is ``SystemExit``'s code (0 when the module returns); an exception that escapes
  prints its traceback and gives 1, as the interpreter does;
- stdout and stderr are captured at file descriptors 1 and 2 and at ``sys.stdout`` and
  ``sys.stderr`` together, so lines written by native code (TensorFlow, libtpu) are in them;
- afterwards the flags the run defined are deleted and the others unparsed (the next run defines
  its command's flags again), and ``sys.argv``, the SIGTERM and SIGINT handlers and absl's
  verbosity are put back;
- absl's once-a-process set-up (the process name, its log handler, faulthandler) is skipped by
  default, as the test process must keep its own; ``process_setup=True`` (a subprocess that only
  runs commands) lets the first run do it, as ``python -m`` would. In the test process, JAX's
  backends are started before the capture (their native start-up lines are the process's).
"""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import traceback
import warnings


def run_module(module: str, *argv: str, process_setup: bool = False) -> subprocess.CompletedProcess:
    """``python -m module argv...`` in this process -> its exit status, stdout and stderr."""
    from absl import app, flags  # noqa: PLC0415 - absl is a dependency of every command
    from absl import logging as absl_logging  # noqa: PLC0415

    app.define_help_flags()  # absl defines them once, at a process's first app.run: kept
    baseline = set(flags.FLAGS)
    saved_argv, verbosity = sys.argv, absl_logging.get_verbosity()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    setup_done = app._run_init.done  # noqa: SLF001 - absl's once-a-process flag
    if not process_setup:
        app._run_init.done = True  # noqa: SLF001
        import jax  # noqa: PLC0415

        # The test process's JAX backends start before the capture: what they print natively
        # (a CUDA plugin's failed cuInit, where the test process probes for GPUs) is the
        # process's start-up, which a command's own process keeps quiet (bertjax.startup).
        jax.devices()
    files = [tempfile.TemporaryFile() for _ in (1, 2)]
    sys.stdout.flush(), sys.stderr.flush()
    saved_fds = [os.dup(1), os.dup(2)]
    code = 0
    try:
        for fd, f in zip((1, 2), files, strict=True):
            os.dup2(f.fileno(), fd)
        streams = [io.TextIOWrapper(open(fd, "wb", closefd=False), write_through=True)  # noqa: SIM115
                   for fd in (1, 2)]  # fmt: skip
        with contextlib.redirect_stdout(streams[0]), contextlib.redirect_stderr(streams[1]):
            sys.argv = [module, *argv]
            try:
                with warnings.catch_warnings():
                    # runpy's warning that the module was imported before (a test imported it,
                    # or an earlier run): expected here, where it runs as __main__ again.
                    warnings.filterwarnings("ignore", ".* found in sys.modules after import of "
                                            "package", RuntimeWarning)  # fmt: skip
                    runpy.run_module(module, run_name="__main__", alter_sys=True)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:  # noqa: BLE001 - what the interpreter does with one that escapes
                traceback.print_exc()
                code = 1
            for stream in streams:
                stream.flush()
    finally:
        for fd, saved in zip((1, 2), saved_fds, strict=True):
            os.dup2(saved, fd)
            os.close(saved)
        sys.argv = saved_argv
        for name in set(flags.FLAGS) - baseline:  # the command's own flags
            delattr(flags.FLAGS, name)
        flags.FLAGS.unparse_flags()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        absl_logging.set_verbosity(verbosity)
        if not process_setup:
            app._run_init.done = setup_done  # noqa: SLF001
    out, err = (f.seek(0) or f.read().decode("utf-8", "replace") for f in files)
    for f in files:
        f.close()
    return subprocess.CompletedProcess([module, *argv], code, out, err)
