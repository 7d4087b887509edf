"""bertjax.cpu_malloc: when the CLI re-executes itself with huge pages and the big-block cache,
that the cache behaves as malloc must (and as its contract says), and that both cut the page
faults of XLA:CPU's per-run temporary buffer."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from bertjax import cpu_malloc

# The process's own conditions, without the JAX_PLATFORMS/plugin rule (tests set JAX_PLATFORMS).
MACHINE_REASON = cpu_malloc.skip_reason({"JAX_PLATFORMS": "cpu"})
needs_huge_pages = pytest.mark.skipif(
    MACHINE_REASON is not None, reason=f"huge pages unavailable here: {MACHINE_REASON}"
)


def _env(**extra) -> dict:
    ours = ("GLIBC_TUNABLES", "LD_PRELOAD", "BERTJAX_CPU_MALLOC", "BERTJAX_BIG_BLOCK_MIN")
    ours += ("BERTJAX_CPU_MALLOC_REEXECUTED",)
    env = {k: v for k, v in os.environ.items() if k not in ours}
    env.update(JAX_PLATFORMS="cpu", **extra)
    return env


def _cache_library() -> str:
    try:
        return str(cpu_malloc.build_cache())
    except cpu_malloc.native.BuildError as e:
        pytest.skip(f"no C compiler here: {e}")


def test_transparent_huge_pages_mode(tmp_path):
    path = tmp_path / "enabled"
    path.write_text("always [madvise] never\n")
    assert cpu_malloc.transparent_huge_pages(str(path)) == "madvise"
    path.write_text("[never]\n")
    assert cpu_malloc.transparent_huge_pages(str(path)) == "never"
    assert cpu_malloc.transparent_huge_pages(str(tmp_path / "absent")) == "unknown"


@needs_huge_pages
def test_skip_reasons(monkeypatch):
    assert cpu_malloc.skip_reason({"JAX_PLATFORMS": "cpu"}) is None
    assert "BERTJAX_CPU_MALLOC=0" in cpu_malloc.skip_reason(
        {"JAX_PLATFORMS": "cpu", "BERTJAX_CPU_MALLOC": "0"}
    )
    assert "names an accelerator" in cpu_malloc.skip_reason({"JAX_PLATFORMS": "tpu,cpu"})
    monkeypatch.setattr(cpu_malloc, "accelerator_plugin", lambda: "jax_plugins.xla_cuda13")
    assert "xla_cuda13" in cpu_malloc.skip_reason({})
    assert cpu_malloc.skip_reason({"JAX_PLATFORMS": "cpu"}) is None  # explicit CPU wins
    monkeypatch.setattr(cpu_malloc, "accelerator_plugin", lambda: None)
    assert cpu_malloc.skip_reason({}) is None
    monkeypatch.setattr(cpu_malloc, "transparent_huge_pages", lambda path=None: "never")
    assert "'never'" in cpu_malloc.skip_reason({})
    monkeypatch.setattr(cpu_malloc.platform, "libc_ver", lambda: ("glibc", "2.31"))
    assert "glibc 2.31 < 2.35" in cpu_malloc.skip_reason({})
    monkeypatch.setattr(cpu_malloc.platform, "libc_ver", lambda: ("", ""))
    assert "not Linux/glibc" in cpu_malloc.skip_reason({})


REEXEC = textwrap.dedent(
    """
    import os
    from bertjax import cpu_malloc
    print("start", os.getpid(), os.environ.get("GLIBC_TUNABLES"), flush=True)
    cpu_malloc.reexec_with_huge_pages()
    print("run", os.getpid(), cpu_malloc.status(), flush=True)
    """
)


def _lines(env: dict) -> list[list[str]]:
    out = subprocess.run(
        [sys.executable, "-c", REEXEC], env=env, capture_output=True, text=True, check=True
    ).stdout
    return [line.split(" ", 2) for line in out.splitlines()]


@needs_huge_pages
def test_reexec_once_keeping_other_tunables_and_pid():
    (start1, pid1, before), (start2, pid2, after), (run, pid3, status) = _lines(
        _env(GLIBC_TUNABLES="glibc.malloc.check=0")
    )
    assert (start1, start2, run) == ("start", "start", "run")
    assert pid1 == pid2 == pid3  # exec, not a child process
    assert before == "glibc.malloc.check=0"
    assert after == f"glibc.malloc.check=0:{cpu_malloc.TUNABLE}"
    assert status.startswith("malloc: transparent huge pages")
    assert status.endswith("blocks >= 64 MiB kept for reuse (bertjax big-block cache)")


@needs_huge_pages
def test_a_users_hugetlb_setting_is_kept():
    lines = _lines(_env(GLIBC_TUNABLES="glibc.malloc.hugetlb=0"))
    (start, _, before), (run, _, status) = lines[0], lines[-1]
    assert (start, before, run) == ("start", "glibc.malloc.hugetlb=0", "run")
    assert status.startswith("malloc: GLIBC_TUNABLES sets glibc.malloc.hugetlb=0 (left as set)")
    # Nothing else to add without the cache: no re-execution at all.
    (start, _, before), (run, _, status) = _lines(
        _env(GLIBC_TUNABLES="glibc.malloc.hugetlb=0", BERTJAX_CPU_MALLOC="hugepages")
    )
    assert status.endswith("no big-block cache (BERTJAX_CPU_MALLOC=hugepages)")


def test_no_reexec_when_turned_off():
    (start, _, before), (run, _, status) = _lines(_env(BERTJAX_CPU_MALLOC="0"))
    assert (start, before, run) == ("start", "None", "run")
    assert "glibc defaults (BERTJAX_CPU_MALLOC=0)" in status
    assert status.endswith("no big-block cache (BERTJAX_CPU_MALLOC=0)")


@needs_huge_pages
def test_the_cache_is_left_out_beside_another_malloc_or_without_a_compiler(tmp_path):
    other = tmp_path / "libjemalloc.so.2"  # never loaded: the re-execution leaves it alone
    reason = cpu_malloc.cache_skip_reason({"LD_PRELOAD": f"{other}"})
    assert reason == f"LD_PRELOAD already has {other}"
    env = _env(CC="false", BERTJAX_CACHE_DIR=str(tmp_path / "cache"))
    (_, pid1, _), (_, pid2, _), (run, pid3, status) = _lines(env)
    assert pid1 == pid2 == pid3 and run == "run"
    assert status.startswith("malloc: transparent huge pages")
    assert "no big-block cache (cannot build it: compiling" in status
    assert not list((tmp_path / "cache").glob("*.so"))


# Drives malloc/free/realloc/posix_memalign/malloc_usable_size through libc with the cache
# preloaded and a 1 MiB threshold, checking each result against the cache's contract.
CACHE_PROBE = textwrap.dedent(
    """
    import ctypes, json, threading
    from bertjax import cpu_malloc
    libc = ctypes.CDLL(None)
    libc.malloc.restype = libc.realloc.restype = libc.calloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.calloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    libc.realloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.malloc_usable_size.argtypes = [ctypes.c_void_p]
    libc.malloc_usable_size.restype = ctypes.c_size_t
    size_t, void_pp = ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)
    libc.posix_memalign.argtypes = [void_pp, size_t, size_t]
    MiB = 1 << 20
    out = {"start": cpu_malloc.cache_stats()}

    # A one-off block is unmapped on free; a recurring size is kept and handed out again.
    a = libc.malloc(3 * MiB); ctypes.memset(a, 7, 3 * MiB); libc.free(a)
    out["one_off"] = cpu_malloc.cache_stats()
    b = libc.malloc(3 * MiB); libc.free(b)
    c = libc.malloc(3 * MiB + 4096)  # within 1.25x: the same block
    out["reused_same_pointer"] = c == b
    out["usable"] = libc.malloc_usable_size(c) >= 3 * MiB + 4096
    out["after_reuse"] = cpu_malloc.cache_stats()
    d = libc.malloc(12 * MiB)  # far larger: never served by the cached 3 MiB block
    out["distinct"] = d not in (b, c)

    # realloc keeps the contents, growing out of the block and back into glibc's range.
    buf = (ctypes.c_ubyte * 64).from_address(c); buf[:] = bytes(range(64))
    e = libc.realloc(c, 20 * MiB)
    out["realloc_kept"] = bytes((ctypes.c_ubyte * 64).from_address(e)) == bytes(range(64))
    f = libc.realloc(e, 1000)
    out["shrink_kept"] = bytes((ctypes.c_ubyte * 64).from_address(f)) == bytes(range(64))
    libc.reallocarray.restype = ctypes.c_void_p
    libc.reallocarray.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    g = libc.reallocarray(d, 4 * MiB, 4)  # our 12 MiB block, grown through reallocarray
    ctypes.memset(g, 1, 16 * MiB)
    out["reallocarray"] = g is not None and libc.reallocarray(None, 1 << 62, 16) is None
    libc.free(f); libc.free(g)

    # Alignment up to a huge page is honoured; invalid alignments are refused as POSIX says.
    ptr = ctypes.c_void_p()
    out["align"] = []
    for alignment in (64, 4096, 1 << 16, 2 * MiB):
        rc = libc.posix_memalign(ctypes.byref(ptr), alignment, 5 * MiB)
        out["align"].append(rc == 0 and ptr.value % alignment == 0)
        libc.free(ptr.value)
    out["einval"] = libc.posix_memalign(ctypes.byref(ptr), 24, 5 * MiB)

    # calloc stays glibc's and comes back zeroed even after dirty blocks were freed.
    z = libc.calloc(3 * MiB, 1)
    out["calloc_zero"] = not any(bytes((ctypes.c_ubyte * (3 * MiB)).from_address(z)))
    libc.free(z)

    # Many threads allocating, writing and freeing recurring sizes at once.
    errors = []
    def worker(seed):
        for i in range(200):
            size = (2 + (seed + i) % 3) * MiB
            p = libc.malloc(size)
            ctypes.memset(p, seed, size)
            if (ctypes.c_ubyte * 1).from_address(p + size - 1)[0] != seed:
                errors.append(seed)
            libc.free(p)
    threads = [threading.Thread(target=worker, args=(s,)) for s in range(1, 9)]
    [t.start() for t in threads]; [t.join() for t in threads]
    out["thread_errors"] = len(errors)
    out["end"] = cpu_malloc.cache_stats()
    print(json.dumps(out))
    """
)


def test_big_block_cache_contract():
    env = _env(LD_PRELOAD=_cache_library(), BERTJAX_BIG_BLOCK_MIN=str(1 << 20))
    result = subprocess.run(
        [sys.executable, "-c", CACHE_PROBE], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["start"]["min_block_bytes"] == 1 << 20
    one_off = out["one_off"]
    assert one_off["maps"] - out["start"]["maps"] == 1
    assert one_off["unmaps"] - out["start"]["unmaps"] == 1  # as glibc would
    assert out["reused_same_pointer"] and out["usable"] and out["distinct"]
    assert out["after_reuse"]["reuses"] - one_off["reuses"] == 1
    assert out["realloc_kept"] and out["shrink_kept"] and out["reallocarray"]
    assert out["align"] == [True] * 4
    assert out["einval"] == 22  # EINVAL
    assert out["calloc_zero"]
    assert out["thread_errors"] == 0
    end = out["end"]
    assert end["reuses"] > 1000  # 1600 recurring allocations, nearly all served from the cache
    assert end["cached_bytes"] <= 4 * 5 * (1 << 20) + (4 << 20)  # at most 4 free blocks kept


PROBE = textwrap.dedent(
    """
    import json, resource
    import jax, jax.numpy as jnp

    @jax.jit
    def f(x):
        y = x @ x.T  # <f32>[4096, 4096]: a 64 MiB temporary
        return jnp.sum(y) + jnp.max(y)

    x = jnp.ones((4096, 64), jnp.float32)
    temp = f.lower(x).compile().memory_analysis().temp_size_in_bytes
    jax.block_until_ready(f(x))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        jax.block_until_ready(f(x))
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 4
    print(json.dumps({"temp": temp, "faults": faults}))
    """
)


def _probe(env: dict) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.splitlines()[-1])


@needs_huge_pages
def test_huge_pages_and_the_cache_cut_the_page_faults_of_xla_temporaries():
    default = _probe(_env())
    huge = _probe(_env(GLIBC_TUNABLES=cpu_malloc.TUNABLE))
    cached = _probe(_env(GLIBC_TUNABLES=cpu_malloc.TUNABLE, LD_PRELOAD=_cache_library()))
    assert default["temp"] >= 64 << 20
    # glibc's default: every run faults its 64 MiB temporary back in, 4 KiB at a time.
    assert default["faults"] > 0.5 * default["temp"] / 4096
    assert huge["faults"] < default["faults"] / 5
    # The cache hands the same pages back every run: not even the huge-page faults remain.
    assert cached["faults"] < 2 * 1024 * 1024 / 4096
    assert cached["faults"] < huge["faults"]
