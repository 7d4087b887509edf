"""Builds the package's small native libraries on first use, cached by content.

Used by :mod:`bertjax.cpu_gemm` (the MKL GEMM kernel, C++) and :mod:`bertjax.cpu_malloc` (the
big-block cache, C). Neither is built at install time: the sources ship with the package and
:func:`build` compiles one with the system compiler the first time it is needed, into
``$BERTJAX_CACHE_DIR`` (default ``~/.cache/bertjax``), under a name keyed by the source, the
compiler's version, the flags and any extra identity (a jaxlib version, say). It builds beside the
target and renames into place, so a concurrent or killed build never leaves a half-written
library under the cached name. This module imports nothing heavy: cpu_malloc uses it before JAX
starts.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile
from collections.abc import Sequence


class BuildError(RuntimeError):
    """The library cannot be built here; the message says why."""


def cache_dir() -> pathlib.Path:
    default = pathlib.Path.home() / ".cache" / "bertjax"
    return pathlib.Path(os.environ.get("BERTJAX_CACHE_DIR", default))


def build(
    source: pathlib.Path,
    *,
    compiler_env: str,
    compilers: Sequence[str],
    flags: Sequence[str],
    identity: Sequence[str] = (),
    libraries: Sequence[str] = (),
) -> pathlib.Path:
    """The path of ``source`` built as a shared library (built now unless cached).

    The compiler is ``$<compiler_env>`` if set, else the first of ``compilers`` on PATH;
    ``libraries`` are linker arguments placed after the source.
    """
    on_path = (shutil.which(name) for name in compilers)  # looked up only if the env is unset
    compiler = os.environ.get(compiler_env) or next(filter(None, on_path), None)
    if not compiler:
        raise BuildError(f"no compiler found for {source.name} (set {compiler_env} or install gcc)")
    flags = [*flags, "-shared", "-fPIC"]
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    except OSError as e:
        raise BuildError(f"cannot run the compiler {compiler!r}: {e}") from None
    key_parts = [source.read_text(), version, *flags, *libraries, *identity]
    key = hashlib.sha256("\0".join(key_parts).encode()).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}-{key}.so"
    if target.exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = pathlib.Path(tmp) / target.name
            cmd = [compiler, *flags, str(source), "-o", str(built), *libraries]
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode != 0:
                raise BuildError(f"compiling {source} failed:\n{result.stderr[-2000:]}")
            os.replace(built, target)
    except OSError as e:
        raise BuildError(f"cannot build {source.name} in {target.parent}: {e}") from None
    return target
