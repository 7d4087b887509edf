"""Huge pages for XLA:CPU's per-step buffers: ``python -m bertjax.main`` re-executes itself once
with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``.

XLA:CPU allocates each execution's temporary buffer (all activations of a train step: ~1.4 GB
for BERT-base at 8x128) with ``malloc`` and frees it when the step ends. glibc serves blocks
above 32 MiB with a fresh ``mmap`` and unmaps them on ``free``, so every step the kernel
page-faults the whole buffer back in, 4 KiB at a time (BERT-base 8x128 on 2 cores: ~340k minor
faults and ~0.8 s of system time per ~4.3 s step). With the glibc tunable
``glibc.malloc.hugetlb=1`` (glibc >= 2.35) malloc marks its mmapped blocks ``MADV_HUGEPAGE``: the
same buffer faults in as 2 MiB transparent huge pages, ~500x fewer faults. Memory is handed back
to the OS exactly as before. (Keeping freed memory instead, with ``mallopt``, saves the faults
too but fragments the heap: some XLA programs then held several times their temporaries.)

glibc reads tunables only when a process starts, hence :func:`reexec_with_huge_pages`: called
first thing by ``python -m bertjax.main`` and ``python -m bertjax.finetune``, it re-executes the
same command line (same PID) with the tunable added to ``GLIBC_TUNABLES``, once. It does so only
where XLA:CPU does the compute and the kernel can comply:

* Linux with glibc >= 2.35, transparent huge pages not ``never``
  (``/sys/kernel/mm/transparent_hugepage/enabled``);
* ``JAX_PLATFORMS`` naming only ``cpu``, or unset with no accelerator plugin installed (libtpu,
  ``jax_plugins``);
* not turned off with ``BERTJAX_CPU_MALLOC=0``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import pkgutil
import platform
import sys

TUNABLE_NAME = "glibc.malloc.hugetlb"
TUNABLE = f"{TUNABLE_NAME}=1"
ENV_SWITCH = "BERTJAX_CPU_MALLOC"
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"
_ACCELERATORS = ("tpu", "cuda", "gpu", "rocm", "metal")


def accelerator_plugin() -> str | None:
    """The name of an installed JAX accelerator plugin (libtpu, jax_plugins.*), else None."""
    if importlib.util.find_spec("libtpu") is not None:
        return "libtpu"
    try:
        import jax_plugins  # noqa: PLC0415 - namespace package of PJRT plugins, if any
    except ImportError:
        pass
    else:
        for module in pkgutil.iter_modules(jax_plugins.__path__):
            return f"jax_plugins.{module.name}"
    for entry in importlib.metadata.entry_points(group="jax_plugins"):
        return entry.name
    return None


def transparent_huge_pages(path: str = THP_ENABLED) -> str:
    """The kernel's THP mode (``always`` | ``madvise`` | ``never``), or ``unknown``."""
    try:
        with open(path, encoding="ascii") as f:
            text = f.read()
    except OSError:
        return "unknown"
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else "unknown"


def skip_reason(environ=os.environ) -> str | None:
    """Why huge pages are not requested in this process, or None if they are."""
    if environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "off", "no"):
        return f"{ENV_SWITCH}={environ[ENV_SWITCH]}"
    libc, version = platform.libc_ver()
    if sys.platform != "linux" or libc != "glibc":
        return f"not Linux/glibc ({sys.platform}, {libc or 'unknown libc'})"
    if tuple(int(x) for x in version.split(".")[:2] if x.isdigit()) < (2, 35):
        return f"glibc {version} < 2.35 has no {TUNABLE_NAME}"
    if (mode := transparent_huge_pages()) not in ("always", "madvise"):
        return f"transparent huge pages are {mode!r} ({THP_ENABLED})"
    platforms = [p.strip().lower() for p in environ.get("JAX_PLATFORMS", "").split(",")]
    if platforms := [p for p in platforms if p]:
        named = [p for p in platforms if p.startswith(_ACCELERATORS)]
        return f"JAX_PLATFORMS={environ['JAX_PLATFORMS']} names an accelerator" if named else None
    plugin = accelerator_plugin()
    return f"accelerator plugin {plugin} installed" if plugin else None


def hugetlb_setting(environ=os.environ) -> str | None:
    """The ``glibc.malloc.hugetlb=...`` entry of ``GLIBC_TUNABLES``, if any (ours or the user's)."""
    tunables = environ.get("GLIBC_TUNABLES", "").split(":")
    entries = [t for t in tunables if t.split("=")[0] == TUNABLE_NAME]
    return entries[-1] if entries else None


def status(environ=os.environ) -> str:
    """One line for the log: what this process's malloc does with large blocks."""
    setting = hugetlb_setting(environ)
    if setting == TUNABLE:
        return f"malloc: transparent huge pages for large blocks (GLIBC_TUNABLES={TUNABLE})"
    if setting is not None:
        return f"malloc: GLIBC_TUNABLES sets {setting} (left as set)"
    return f"malloc: glibc defaults ({skip_reason(environ) or 'not re-executed'})"


def reexec_with_huge_pages(environ=os.environ) -> None:
    """Re-executes this command line with :data:`TUNABLE` added, once; returns where it does not.

    Call it before any work (the process image is replaced). Where :func:`skip_reason` gives a
    reason, or ``GLIBC_TUNABLES`` already sets ``glibc.malloc.hugetlb`` (to any value: a user's
    choice is kept), or the command line is unknown, it returns.
    """
    argv = getattr(sys, "orig_argv", None)
    if hugetlb_setting(environ) is not None or skip_reason(environ) is not None:
        return
    if not argv or not sys.executable:
        return
    tunables = environ.get("GLIBC_TUNABLES", "")
    env = dict(environ, GLIBC_TUNABLES=f"{tunables}:{TUNABLE}" if tunables else TUNABLE)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv[1:]], env)
