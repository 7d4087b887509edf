"""bertjax.cpu_malloc: when the CLI re-executes itself with huge pages, and that they cut the page
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
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "BERTJAX_CPU_MALLOC")}
    env.update(JAX_PLATFORMS="cpu", **extra)
    return env


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


@needs_huge_pages
def test_a_users_hugetlb_setting_is_kept():
    (start, _, before), (run, _, status) = _lines(_env(GLIBC_TUNABLES="glibc.malloc.hugetlb=0"))
    assert (start, before, run) == ("start", "glibc.malloc.hugetlb=0", "run")
    assert status == "malloc: GLIBC_TUNABLES sets glibc.malloc.hugetlb=0 (left as set)"


def test_no_reexec_when_turned_off():
    (start, _, before), (run, _, status) = _lines(_env(BERTJAX_CPU_MALLOC="0"))
    assert (start, before, run) == ("start", "None", "run")
    assert "glibc defaults (BERTJAX_CPU_MALLOC=0)" in status


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
def test_huge_pages_cut_the_page_faults_of_xla_temporaries():
    default = _probe(_env())
    huge = _probe(_env(GLIBC_TUNABLES=cpu_malloc.TUNABLE))
    assert default["temp"] >= 64 << 20
    # glibc's default: every run faults its 64 MiB temporary back in, 4 KiB at a time.
    assert default["faults"] > 0.5 * default["temp"] / 4096
    assert huge["faults"] < default["faults"] / 5
