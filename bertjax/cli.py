"""What every ``python -m bertjax.<command>`` shares, written once: absl flags, no positional
arguments, and bad input reported as one line ``<command>: error: <message>`` on stderr with exit
status 1, never a traceback. A command's tail is::

    def main() -> None:  # also the console script bertjax-<command>
        cli.run(_run, define_flags, errors=(ConvertError,), prog="convert")


    if __name__ == "__main__":
        main()

``_run(flag_values)`` does the work and returns an exit status (None = 0); tests drive it
in-process, one-line errors included, through :func:`call`. Flags are defined only when the module
runs as a command, so importing it adds no flags to its importer, and TensorFlow is imported
(quietly, see ``bertjax.startup``) only after the flags are parsed, so ``--help`` answers at once.

``BERTJAX_TRACEBACK=1`` in the environment re-raises the error instead, for bug reports.

Signals: SIGTERM stops a command with one line (exit 1) wherever it is, unless the command has
installed its own handler (pretraining's loop saves and exits 0; ``bertjax.pretrain.loop``);
SIGINT (Ctrl-C) likewise, with exit status 130.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

from absl import app, flags

from bertjax import startup

TRACEBACK_ENV = "BERTJAX_TRACEBACK"


class Stopped(Exception):  # noqa: N818 - it is a stop, not an error
    """A SIGTERM stopped the command outside any handler of its own."""


def _stopped(signum, frame):
    del frame
    raise Stopped(signal.Signals(signum).name)


def call(
    main: Callable[[flags.FlagValues], int | None],
    flag_values: flags.FlagValues,
    *,
    errors: tuple[type[Exception], ...] = (ValueError,),
    prog: str = "",
) -> int:
    """``main(flag_values)``'s exit status, or 1 with ``<prog>: error: <message>`` on stderr."""
    prefix = f"{prog}: " if prog else ""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stopped)
    try:
        return main(flag_values) or 0
    except errors as e:
        if os.environ.get(TRACEBACK_ENV) == "1":
            raise
        print(f"{prefix}error: {e}", file=sys.stderr, flush=True)
        return 1
    except Stopped as e:
        print(f"{prefix}stopped by {e} before anything was saved", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt as e:
        if os.environ.get(TRACEBACK_ENV) == "1":
            raise
        print(f"{prefix}{e or 'interrupted (SIGINT)'}", file=sys.stderr, flush=True)
        return 130


def run(
    main: Callable[[flags.FlagValues], int | None],
    define_flags: Callable[[], None] | None = None,
    *,
    errors: tuple[type[Exception], ...] = (ValueError,),
    prog: str = "",
    tensorflow: bool = True,
) -> NoReturn:
    """Defines the flags, parses argv and exits with :func:`call`'s status.

    ``tensorflow``: the command needs TensorFlow, imported quietly before ``main``.
    """
    if define_flags is not None:
        define_flags()

    def absl_main(argv: list[str]) -> NoReturn:
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
        if tensorflow:
            startup.import_tensorflow()
        sys.exit(call(main, flags.FLAGS, errors=errors, prog=prog))

    app.run(absl_main)
