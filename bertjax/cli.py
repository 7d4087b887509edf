"""What every ``python -m bertjax.<tool>`` shares, written once: absl flags, no positional
arguments, and bad input reported as one line ``<tool>: error: <message>`` on stderr with exit
status 1, never a traceback. A tool's ``__main__`` tail is one call::

    if __name__ == "__main__":
        cli.run(_run, define_flags, errors=(ConvertError,), prog="convert")

``_run(flag_values)`` does the work and returns an exit status (None = 0); it stays callable from
tests without a subprocess. Flags are defined only when the module runs as a CLI, so importing
a tool adds no flags to its importer.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn

from absl import app, flags


def run(
    main: Callable[[flags.FlagValues], int | None],
    define_flags: Callable[[], None] | None = None,
    *,
    errors: tuple[type[Exception], ...] = (ValueError,),
    prog: str = "",
) -> NoReturn:
    """Defines the flags, parses argv and exits with ``main(FLAGS)``'s status (``errors`` -> 1)."""
    if define_flags is not None:
        define_flags()
    prefix = f"{prog}: " if prog else ""

    def absl_main(argv: list[str]) -> NoReturn:
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
        try:
            status = main(flags.FLAGS)
        except errors as e:
            print(f"{prefix}error: {e}", file=sys.stderr, flush=True)
            sys.exit(1)
        sys.exit(status or 0)

    app.run(absl_main)
