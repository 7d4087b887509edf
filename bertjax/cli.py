"""What every ``python -m bertjax.<command>`` shares, written once: absl flags, no positional
arguments (a command that runs another tool may take everything after ``--`` as one flag's
value: ``rest_flag``), and bad input reported as one line ``<command>: error: <message>`` on
stderr with exit status 1, never a traceback (``errors`` and ``OSError``: the file system's
problems are the user's to fix). A command's tail is::

    def main() -> None:  # also the console script bertjax-<command>
        cli.run(_run, define_flags, errors=(ConvertError,), prog="convert")


    if __name__ == "__main__":
        main()

``_run(flag_values)`` does the work and returns an exit status (None = 0); tests drive it
in-process, one-line errors included, through :func:`call`. Flags are defined only when the module
runs as a command, so importing it adds no flags to its importer, and TensorFlow is imported
(quietly, see ``bertjax.startup``) only after the flags are parsed, so ``--help`` answers at once.

Bad flags fail while absl parses them, before ``_run``: :func:`run` hands absl its own parser,
which reports in the same one line an unknown or missing flag, a value of the wrong type, a
positional argument, and a ``--config`` file (``ml_collections.config_flags``) that is missing,
not valid Python, raises ValueError or TypeError in ``get_config``, or gets an override of a key
it does not have (with ml_collections' "did you mean"). Any other exception is a bug and keeps its
traceback.

Storage clients' errors count as OSError does (a ``gs://`` object or bucket that is missing or
forbidden, missing credentials, retries spent: TensorFlow's file system, google-cloud-storage,
google-auth; :func:`_storage_errors`), printed whole on one line, since TensorFlow names the
path on the message's last line.

``BERTJAX_TRACEBACK=1`` in the environment re-raises the error instead, for bug reports.

Signals: SIGTERM stops a command with one line (exit 1) wherever it is, unless the command has
installed its own handler (the training loop saves and exits 0;
``bertjax.training.preemption``), or ``jax.distributed.initialize`` has (several processes:
JAX's preemption notifier takes SIGTERM from then on, and the training loop stops every process
at one step); SIGINT (Ctrl-C) likewise, with exit status 130.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import NoReturn

from absl import app, flags
from ml_collections.config_flags.config_flags import is_config_flag  # public, unlike _ConfigFlag

from bertjax import startup

TRACEBACK_ENV = "BERTJAX_TRACEBACK"


class Stopped(BaseException):  # noqa: N818 - a stop, like KeyboardInterrupt: never swallowed
    """A SIGTERM stopped the command outside any handler of its own."""


def _stopped(signum, frame):
    del frame
    raise Stopped(signal.Signals(signum).name)


def _stop_on_sigterm() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stopped)


def call(
    main: Callable[[flags.FlagValues], int | None],
    flag_values: flags.FlagValues,
    *,
    errors: tuple[type[Exception], ...] = (ValueError,),
    prog: str = "",
) -> int:
    """``main(flag_values)``'s exit status, or 1 with ``<prog>: error: <message>`` on stderr."""
    prefix = f"{prog}: " if prog else ""
    _stop_on_sigterm()
    try:
        return main(flag_values) or 0
    except Exception as e:
        storage = _storage_errors()
        # OSError: a missing file, a full disk, a permission; storage errors likewise.
        if not isinstance(e, (*errors, OSError, *storage)) or os.environ.get(TRACEBACK_ENV) == "1":
            raise
        if isinstance(e, storage):  # TensorFlow's name the gs:// path on a later line
            message = " ".join(str(e).split()) or type(e).__name__
        else:
            message = (str(e).splitlines() or [type(e).__name__])[0]
        print(f"{prefix}error: {message}", file=sys.stderr, flush=True)
        return 1
    except Stopped as e:
        print(f"{prefix}stopped by {e} before anything was saved", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt as e:
        if os.environ.get(TRACEBACK_ENV) == "1":
            raise
        print(f"{prefix}{e or 'interrupted (SIGINT)'}", file=sys.stderr, flush=True)
        return 130


def _storage_errors() -> tuple[type[Exception], ...]:
    """What the storage clients a command has loaded raise for a path the user must fix, like
    OSError (a missing or forbidden ``gs://`` object or bucket, no credentials, retries spent):
    TensorFlow's file-system errors, google-cloud-storage's HTTP errors, google-auth's."""
    found = []
    tf_errors = sys.modules.get("tensorflow.python.framework.errors_impl")
    if tf_errors is not None:
        found += [getattr(tf_errors, f"{name}Error") for name in (
            "NotFound", "PermissionDenied", "Unauthenticated", "Unavailable", "Aborted",
            "DeadlineExceeded", "ResourceExhausted")]  # fmt: skip
    if (api := sys.modules.get("google.api_core.exceptions")) is not None:
        found.append(api.GoogleAPICallError)
    if (auth := sys.modules.get("google.auth.exceptions")) is not None:
        found.append(auth.GoogleAuthError)
    return tuple(found)


_REQUIRED = r"flag --(\S+)=None: Flag --\1 must have a value other than None\."  # absl's words


def parse_flags(argv: list[str], *, prog: str = "", rest_flag: str | None = None,
                renamed=None) -> list[str]:  # fmt: skip
    """absl's ``flags_parser`` for :func:`run`: parses ``argv`` into ``flags.FLAGS``; bad input
    exits 1 with one line (see the module docstring), any other exception propagates.

    ``rest_flag``: the arguments after a ``--`` are appended (shell-quoted) to this string flag's
    value, e.g. another tool's options (``create_pretraining_data ... -- --project=P``).
    ``renamed``: a module with ``new_key(key)`` and ``moved(message)`` for config keys that moved
    (``bertjax.finetune.schema``): an old key is one line naming its new one."""
    try:
        _check_renamed(argv, renamed)
        passed = []
        if rest_flag and "--" in argv:
            argv, passed = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
        rest = flags.FLAGS(argv)
        _load_config_files(flags.FLAGS)
        if len(rest) > 1:
            raise flags.Error(f"unexpected arguments {shlex.join(rest[1:])}: give only --flags")
        if passed:
            flag = flags.FLAGS[rest_flag]
            flag.value = " ".join(v for v in (flag.value, shlex.join(passed)) if v)
    except Exception as e:
        message = _input_error(e, argv, flags.FLAGS)
        moved = renamed.moved(" ".join(map(str, _chain(e)))) if renamed is not None else None
        if moved is not None:  # a config file that uses a key that moved: its new name
            files = [a for a in argv if re.match(r"--?config(=|$)", a)]
            message = f"{files[-1] if files else '--config'}: {moved}"
        if message is None or os.environ.get(TRACEBACK_ENV) == "1":
            raise
        print(f"{prog}: error: {message}" if prog else f"error: {message}", file=sys.stderr)
        sys.exit(1)
    return rest


def _check_renamed(argv: list[str], renamed) -> None:
    """Raises flags.Error for a ``--config.KEY`` whose KEY moved (``renamed.new_key``)."""
    if renamed is None:
        return
    for arg in argv:
        match = re.match(r"--?(?:no)?config\.([^=\s]+)", arg)
        if match and (new := renamed.new_key(match[1])):
            raise flags.Error(
                f"--config.{match[1]} is --config.{new} now (fine-tuning configs "
                "use pretraining's sections; configs/finetune_base.py lists them)"
            )


def _load_config_files(flag_values: flags.FlagValues) -> None:
    """Raises the OSError of a config file that did not load (missing, a directory, unreadable).

    ml_collections parses such a flag into a stand-in that raises the error on the first
    attribute access, which would come after TensorFlow's import, maybe after writing begins.
    """
    for name in flag_values:
        flag = flag_values[name]
        if is_config_flag(flag) and flag.value is not None:
            hasattr(flag.value, "lock")  # the stand-in raises OSError, not AttributeError


def _input_error(error: Exception, argv: list[str], flag_values: flags.FlagValues) -> str | None:
    """The one-line message for a bad flag or config file, None for anything else (a bug)."""
    if isinstance(error, flags.Error):
        return _flag_error(error)
    config_files = {n: _argument(argv, n) for n in flag_values if is_config_flag(flag_values[n])}
    if isinstance(error, OSError):  # parsing reads only the files that the command line names
        return _config_load_error(error, config_files)
    if isinstance(error, SyntaxError):
        return _syntax_error(error, config_files)
    if isinstance(error, KeyError | AttributeError):
        return _unknown_key(error, argv, config_files)
    return None


def _flag_error(error: flags.Error) -> str:
    message = str(error)
    lines = message.splitlines()
    missing = [re.fullmatch(_REQUIRED, line) for line in lines]
    if lines and all(missing):  # absl: one line per required flag left out
        names = ", ".join(f"--{match[1]}" for match in missing)
        return f"{names} {'is' if len(missing) == 1 else 'are'} required"
    if "\n" in message:
        # ml_collections puts the whole traceback of a config file's get_config into absl's
        # "flag --config=FILE: Error whilst parsing config file:\n\n..."; keep the error raised.
        raised = [e for e in _chain(error) if "Traceback (most recent call last)" not in str(e)]
        if raised and raised[0] is not error:
            head = lines[0].rsplit(": ", 1)[0]  # "flag --config=FILE"
            message = f"{head}: {raised[0]}"
        message = " ".join(message.split())
    if isinstance(error, flags.UnrecognizedFlagError):
        message += " (--helpshort lists the flags)"
    return message.removeprefix("flag ")


def _config_load_error(error: OSError, config_files: dict[str, str | None]) -> str:
    # ml_collections: "Failed loading config file ...\n  Attempted ...\n      [Errno 2] No such ..."
    reason = str(list(_chain(error))[-1]).strip().splitlines()[-1].strip()
    reason = re.sub(r"^\[Errno \d+\] ", "", reason)
    for name, argument in config_files.items():
        if argument is not None:
            path = argument.split(":", 1)[0]
            if path and not os.path.isabs(path) and not os.path.exists(path):
                reason += f" (relative to {os.getcwd()})"
            return f"--{name}={argument}: cannot load the config file: {reason}"
    return reason


def _syntax_error(error: SyntaxError, config_files: dict[str, str | None]) -> str | None:
    """A config file named on the command line that is not Python; None for any other file."""
    for name, argument in config_files.items():
        path = (argument or "").split(":", 1)[0]
        if path and os.path.realpath(error.filename or "") == os.path.realpath(path):
            where = f"line {error.lineno}, column {error.offset}"
            return f"--{name}={argument}: not valid Python: {error.msg} at {where}"
    return None


def _unknown_key(
    error: KeyError | AttributeError, argv: list[str], config_files: dict[str, str | None]
) -> str | None:
    """``--config.train.num_stepz=5``: ml_collections raises KeyError('num_stepz') from the
    lookup, then again with its near miss ('Did you mean "num_steps" ...'). A key that no
    override names is a bug in a config file, not an input error."""
    innermost = list(_chain(error))[-1]
    key = innermost.args[0] if isinstance(innermost, KeyError) and innermost.args else None
    for arg in argv:
        match = re.match(r"--?([^=.\s]+)\.([^=\s]+)", arg)  # --config.a.b=1, --noconfig.a.b
        name = match and next((n for n in (match[1], match[1][2:]) if n in config_files), None)
        parts = match[2].split(".") if name else []
        if isinstance(key, str) and key in parts:
            prefix = parts[: parts.index(key)]
            file = (config_files[name] or "").split(":", 1)[0]
            message = f"{arg.split('=', 1)[0]}: {file} has no key {'.'.join([*prefix, key])}"
            near = re.search(r'Did you mean "([^"]+)"', " ".join(map(str, _chain(error))))
            return message + (f"; did you mean {'.'.join([*prefix, near[1]])}?" if near else "")
    return None


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error``, then the exception it was raised from or while handling, and so on."""
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def _argument(argv: list[str], name: str) -> str | None:
    """The last value of ``--name=VALUE`` / ``--name VALUE`` in ``argv``, as absl reads it."""
    value = None
    for i, arg in enumerate(argv):
        match = re.fullmatch(rf"--?{re.escape(name)}(=.*)?", arg, re.DOTALL)
        if match:
            value = match.group(1)[1:] if match.group(1) else (argv[i + 1 : i + 2] or [None])[0]
    return value


def run(
    main: Callable[[flags.FlagValues], int | None],
    define_flags: Callable[[], None] | None = None,
    *,
    errors: tuple[type[Exception], ...] = (ValueError,),
    prog: str = "",
    tensorflow: bool = True,
    rest_flag: str | None = None,
    renamed=None,
) -> NoReturn:
    """Defines the flags, parses argv (:func:`parse_flags`) and exits with :func:`call`'s status.

    ``tensorflow``: the command needs TensorFlow, imported quietly before ``main``.
    ``rest_flag``: the flag that takes the arguments after ``--`` (:func:`parse_flags`).
    ``renamed``: config keys that moved (:func:`parse_flags`).
    """
    _stop_on_sigterm()  # from here on, before config files load: one line, exit 1

    def absl_main(argv: list[str]) -> NoReturn:
        del argv  # parse_flags allows none beyond the program's name

        def command(flag_values):
            if tensorflow:
                startup.import_tensorflow()
            return main(flag_values)

        sys.exit(call(command, flags.FLAGS, errors=errors, prog=prog))

    try:
        if define_flags is not None:  # ml_collections reads argv here: a SIGTERM may land in it
            define_flags()
        parser = functools.partial(parse_flags, prog=prog, rest_flag=rest_flag, renamed=renamed)
        app.run(absl_main, flags_parser=parser)
    except Stopped as e:  # while the flags were defined, or they and config files were parsed
        print(f"{prog}: stopped by {e} before anything was saved", file=sys.stderr, flush=True)
        sys.exit(1)
