"""Memory for XLA:CPU's per-step buffers: ``python -m bertjax.main`` re-executes itself once
with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` and the big-block cache preloaded.

XLA:CPU allocates each execution's temporary buffer (all activations of a train step: ~1.3 GB
for BERT-base at 8x128) with ``malloc`` and frees it when the step ends. glibc serves blocks
above 32 MiB with a fresh ``mmap`` and unmaps them on ``free``, so every step the kernel
page-faults the whole buffer back in and zeroes it (BERT-base 8x128 on 2 cores: ~340k minor
faults and ~0.8 s of system time per ~4.3 s step with 4 KiB pages).

Two remedies, both applied by :func:`reexec_with_huge_pages`:

* ``glibc.malloc.hugetlb=1`` (glibc >= 2.35): malloc marks its mmapped blocks
  ``MADV_HUGEPAGE``, so what glibc still maps faults in as 2 MiB transparent huge pages,
  ~500x fewer faults.
* The big-block cache (``cpu_malloc.c``, built on first use by :func:`bertjax.native.build` and
  loaded with ``LD_PRELOAD``): requests of at least 64 MiB get their own huge-page mapping, and
  a freed one is kept for the next request of its size if that size recurs (at most 4 free
  blocks; one-off and stale blocks are unmapped as glibc would), so a training loop reuses the
  same pages every step with no faults at all. Everything smaller goes to glibc unchanged. Even
  with huge pages, faulting the buffer in cost 0.1-1.8 s of system time per 1.7-2.9 s
  BERT-base step on a 2-core VM (docs/benchmarks.md). Keeping freed memory in glibc's own heap
  instead (``mmap_max=0`` with one arena) fragments it: 2-3 copies of the buffer stay resident.

glibc reads tunables, and the loader ``LD_PRELOAD``, only when a process starts, hence the
re-execution: called first thing by ``python -m bertjax.main`` and ``python -m
bertjax.finetune``, it re-executes the same command line (same PID) once, with the tunable added
to ``GLIBC_TUNABLES`` (unless the user sets ``glibc.malloc.hugetlb`` already: theirs is kept)
and the cache prepended to ``LD_PRELOAD``. It does so only where XLA:CPU does the compute and
the kernel can comply:

* Linux with glibc >= 2.35, transparent huge pages not ``never``
  (``/sys/kernel/mm/transparent_hugepage/enabled``);
* ``JAX_PLATFORMS`` naming only ``cpu``, or unset with no accelerator plugin installed (libtpu,
  ``jax_plugins``);
* not turned off: ``BERTJAX_CPU_MALLOC=0`` turns both off, ``BERTJAX_CPU_MALLOC=hugepages``
  keeps the tunable only. The cache is also left out when ``LD_PRELOAD`` already names another
  malloc (tcmalloc, jemalloc, ...) or when it cannot be built (no C compiler); :func:`status`
  says which, and why.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import pathlib
import pkgutil
import platform
import sys

from bertjax import native

TUNABLE_NAME = "glibc.malloc.hugetlb"
TUNABLE = f"{TUNABLE_NAME}=1"
ENV_SWITCH = "BERTJAX_CPU_MALLOC"
HUGE_PAGES_ONLY = "hugepages"  # the ENV_SWITCH value that leaves the big-block cache out
CACHE_SOURCE = pathlib.Path(__file__).with_name("cpu_malloc.c")
_REEXECUTED = "BERTJAX_CPU_MALLOC_REEXECUTED"  # set in the re-executed process: never twice
_CACHE_NOTE = "BERTJAX_CPU_MALLOC_CACHE_NOTE"  # why the re-executed process has no cache
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


def cache_skip_reason(environ=os.environ) -> str | None:
    """Why the big-block cache is not preloaded even where huge pages are requested, or None."""
    if environ.get(ENV_SWITCH, "").strip().lower() == HUGE_PAGES_ONLY:
        return f"{ENV_SWITCH}={environ[ENV_SWITCH]}"
    for entry in environ.get("LD_PRELOAD", "").replace(" ", ":").split(":"):
        name = os.path.basename(entry)
        if "malloc" in name and not name.startswith(CACHE_SOURCE.stem):
            return f"LD_PRELOAD already has {entry}"
    return None


def build_cache() -> pathlib.Path:
    """The big-block cache library (built now unless cached); raises native.BuildError."""
    return native.build(
        CACHE_SOURCE,
        compiler_env="CC",
        compilers=("cc", "gcc"),
        flags=["-O2", "-std=gnu11"],
        libraries=["-lpthread", "-ldl"],
    )


def cache_stats() -> dict[str, int] | None:
    """The big-block cache's counters in this process, or None where it is not loaded."""
    try:
        stats = ctypes.CDLL(None).bertjax_big_block_stats
    except AttributeError:
        return None
    out = (ctypes.c_size_t * 5)()
    stats(out)
    keys = ("maps", "reuses", "unmaps", "cached_bytes", "min_block_bytes")
    return dict(zip(keys, (int(v) for v in out), strict=True))


def status(environ=os.environ) -> str:
    """One line for the log: what this process's malloc does with large blocks."""
    setting = hugetlb_setting(environ)
    if setting == TUNABLE:
        line = f"malloc: transparent huge pages for large blocks (GLIBC_TUNABLES={TUNABLE})"
    elif setting is not None:
        line = f"malloc: GLIBC_TUNABLES sets {setting} (left as set)"
    else:
        line = f"malloc: glibc defaults ({skip_reason(environ) or 'not re-executed'})"
    if (stats := cache_stats()) is not None:
        size = stats["min_block_bytes"] >> 20
        return f"{line}; blocks >= {size} MiB kept for reuse (bertjax big-block cache)"
    why = environ.get(_CACHE_NOTE) or cache_skip_reason(environ) or skip_reason(environ)
    return f"{line}; no big-block cache ({why or 'not preloaded'})"


def reexec_with_huge_pages(environ=os.environ) -> None:
    """Re-executes this command line once with huge pages and the big-block cache; else returns.

    Call it before any work (the process image is replaced). It returns where :func:`skip_reason`
    gives a reason, in the re-executed process itself, where there is nothing to add (the user
    sets ``glibc.malloc.hugetlb`` and the cache is left out or cannot be built), or where the
    command line is unknown.
    """
    argv = getattr(sys, "orig_argv", None)
    if environ.get(_REEXECUTED) or skip_reason(environ) is not None:
        return
    if not argv or not sys.executable:
        return
    env = dict(environ)
    env[_REEXECUTED] = "1"
    if hugetlb_setting(environ) is None:
        tunables = environ.get("GLIBC_TUNABLES", "")
        env["GLIBC_TUNABLES"] = f"{tunables}:{TUNABLE}" if tunables else TUNABLE
    if cache_skip_reason(environ) is None:
        try:
            library = str(build_cache())
        except native.BuildError as e:
            env[_CACHE_NOTE] = f"cannot build it: {str(e).splitlines()[0]}"
        else:
            preload = environ.get("LD_PRELOAD", "")
            env["LD_PRELOAD"] = f"{library}:{preload}" if preload else library
    if all(env.get(k) == environ.get(k) for k in ("GLIBC_TUNABLES", "LD_PRELOAD")):
        return  # nothing to add
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv[1:]], env)
