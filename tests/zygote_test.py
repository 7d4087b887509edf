"""``tests/zygote.py``: a forked command process behaves as ``subprocess`` would start it.

The probe is this module run as ``python -m tests.zygote_test MODE``: it reports what a fresh
process would have (its argv, working directory, environment, JAX's settings from ``JAX_*``,
the device count from ``XLA_FLAGS``), or exits, raises, or waits for a signal.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import zygote

PROBE = [sys.executable, "-m", "tests.zygote_test"]


def _environ(**extra) -> dict:
    return {**os.environ, **extra}


def test_a_child_gets_its_argv_cwd_environment_jax_settings_and_devices(tmp_path):
    env = _environ(
        XLA_FLAGS="--xla_force_host_platform_device_count=3",
        JAX_DISABLE_MOST_OPTIMIZATIONS="0",
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="7",
        JAX_COMPILATION_CACHE_DIR=str(tmp_path / "cache"),
        ZYGOTE_PROBE="here",
    )
    done = zygote.run([*PROBE, "report", "x y"], env=env, cwd=tmp_path, capture_output=True,
                      text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    assert seen["argv"][1:] == ["report", "x y"] and seen["argv"][0].endswith("zygote_test.py")
    assert seen["cwd"] == str(tmp_path) and seen["env"] == "here"
    assert seen["devices"] == 3 and seen["pid"] != os.getpid()
    assert seen["jax"] == {
        "jax_disable_most_optimizations": False,
        "jax_persistent_cache_min_compile_time_secs": 7.0,
        "jax_compilation_cache_dir": str(tmp_path / "cache"),
        "jax_platforms": "cpu",  # bertjax.startup's default on a machine without accelerators
    }
    # Another child, other settings: nothing carries over from the first.
    other = zygote.run([*PROBE, "report"], env=_environ(JAX_DISABLE_MOST_OPTIMIZATIONS="1"),
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    seen = json.loads(other.stdout)
    assert seen["jax"]["jax_disable_most_optimizations"] is True and seen["env"] is None


def test_exit_statuses_errors_and_signals_are_a_processs():
    run = lambda *args: zygote.run([*PROBE, *args], capture_output=True, text=True, timeout=120)  # noqa: E731
    before = zygote.forked_cpu()
    assert run("exit", "3").returncode == 3
    assert zygote.forked_cpu() > before  # its CPU time, for bench/suite_cost.py
    assert run("exit", "0").returncode == 0
    failed = run("raise")
    assert failed.returncode == 1 and "ValueError: probe" in failed.stderr
    assert failed.stderr.rstrip().splitlines()[-1] == "ValueError: probe"
    said = run("say")  # sys.exit("...") prints the message and exits 1, as python does
    assert said.returncode == 1 and said.stderr == "stopped: probe\n"
    assert run("atexit").stdout == "atexit ran\n"  # the interpreter's exit, handlers included
    for signum, code in ((signal.SIGKILL, -9), (signal.SIGTERM, 0)):
        proc = zygote.popen([*PROBE, "wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
        assert proc.stdout.readline() == "waiting\n"
        assert proc.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.05)
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == code, (signum, proc.returncode)
        assert ("terminated\n" in out) == (signum == signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.run([*PROBE, "wait"], capture_output=True, text=True, timeout=0.5)


def test_output_goes_where_subprocess_would_send_it(tmp_path):
    log = tmp_path / "log.txt"
    with open(log, "w") as f:
        done = zygote.run([*PROBE, "print"], stdout=f, stderr=subprocess.STDOUT, timeout=120)
    assert done.returncode == 0 and log.read_text() == "out\nerr\n"
    quiet = zygote.run([*PROBE, "print"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True, timeout=120)  # fmt: skip
    assert quiet.stdout is None and quiet.stderr == "err\n"


def _probe(mode: str, *args: str) -> None:
    if mode == "report":
        import jax  # noqa: PLC0415
        from jax._src import config  # noqa: PLC0415

        names = ("jax_disable_most_optimizations", "jax_persistent_cache_min_compile_time_secs",
                 "jax_compilation_cache_dir", "jax_platforms")  # fmt: skip
        print(json.dumps({
            "argv": sys.argv, "cwd": os.getcwd(), "env": os.environ.get("ZYGOTE_PROBE"),
            "pid": os.getpid(), "devices": jax.device_count(),
            "jax": {name: config.config._value_holders[name].value for name in names},
        }))  # fmt: skip
    elif mode == "exit":
        sys.exit(int(args[0]))
    elif mode == "raise":
        raise ValueError("probe")
    elif mode == "say":
        sys.exit("stopped: probe")
    elif mode == "atexit":
        import atexit  # noqa: PLC0415

        atexit.register(print, "atexit ran")
    elif mode == "print":
        print("out", flush=True)
        print("err", file=sys.stderr, flush=True)
    elif mode == "wait":
        signal.signal(signal.SIGTERM, lambda *_: (print("terminated", flush=True), sys.exit(0)))
        print("waiting", flush=True)
        time.sleep(300)


if __name__ == "__main__":
    _probe(*sys.argv[1:])
