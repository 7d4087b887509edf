"""bench/accelerator_check.sh end to end on CPU in its tiny mode (interpret-mode kernels, a
one-layer model, four tiny.py steps): the results it writes hold every section with numbers that
agree with what they must be; shellcheck passes it; and the tests' switch to native kernels
refuses to run where the device is not."""

import datetime
import json
import math
import os
import pathlib
import platform
import shutil
import subprocess

import pytest

from bertjax.data import bundled
from tests.model.attention import cases

REPO = pathlib.Path(__file__).parents[2]
SCRIPT = REPO / "bench" / "accelerator_check.sh"


def _run_tiny(out: pathlib.Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, as a run
    # JAX_PLATFORMS: no libtpu probe; most optimizations off: these steps are all compile.
    env.update(JAX_PLATFORMS="cpu", JAX_DISABLE_MOST_OPTIMIZATIONS="1")
    command = ["bash", str(SCRIPT), "--tiny", f"--out={out}"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def test_tiny_mode_writes_every_section_with_its_numbers(tmp_path):
    began = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    result = _run_tiny(tmp_path)
    if result.returncode == 2 and "no peers harness" in result.stderr:
        pytest.skip(result.stderr.strip())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (json_path,) = tmp_path.glob("accelerator_check-*-cpu.json")
    results = json.loads(json_path.read_text())
    markdown = json_path.with_suffix(".md").read_text()

    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True)
    machine = results["machine"]
    assert machine["commit"] == head.stdout.decode().strip()
    assert machine["hostname"] == platform.node()
    assert (machine["platform"], machine["device_count"], machine["chip"]) == ("cpu", 1, None)
    assert began <= datetime.datetime.fromisoformat(machine["date"])
    assert results["mode"] == "tiny"
    assert "Tiny mode: a test of this script, not accelerator timings." in markdown

    shapes = [(r["head_dim"], r["dtype"], r["causal"]) for r in results["self_check"]]
    assert shapes == [(32, "float32", False), (32, "bfloat16", True)]
    for row in results["self_check"]:
        assert row["kernel"] == "tpu_interpret" and row["passed"], row
        assert 0 <= row["kernel_error"] <= row["allowed"] and row["seconds"] > 0
        assert f"| tpu_interpret | 32 | {row['dtype']} | {row['causal']} | True |" in markdown

    tests = results["device_tests"]
    assert (tests["native"], tests["tests"], tests["passed"], tests["failures"]) == (False, 1, 1, 0)
    assert "Attention equality tests in interpret mode: 1 passed, 0 failed" in markdown

    rows = {row["impl"]: row for row in results["step_times"]}
    assert sorted(rows) == ["bertjax-fused", "bertjax-xla", "hf-flax"]
    for impl, row in rows.items():
        assert row["error"] is None and row["batch"] == 4, row
        assert 0 < row["step_s_min"] <= row["step_s_median"] < 10
        assert math.isclose(row["tokens_per_s"], 4 * 32 / row["step_s_median"], rel_tol=1e-6)
        assert row["mfu"] is None  # a CPU has no peak in the chip table
        assert math.isfinite(row["loss_last"])
        assert f"| tiny32 | {impl} | 4 | {row['step_s_median']:.4f} |" in markdown

    tiny = results["tiny_losses"]
    assert tiny["steps"] == [1, 2, 3, 4]
    # Both runs are on CPU here: the same program, so the same losses.
    assert tiny["device"] == tiny["cpu"] and tiny["max_abs_difference"] == 0
    # An untrained model's MLM + NSP loss: ln(vocab) + ln(2).
    vocab = sum(1 for line in open(bundled.bundled_paths().vocab) if line.strip())
    assert abs(tiny["device"][0] - (math.log(vocab) + math.log(2))) < 0.5, tiny["device"]
    assert f"| 1 | {tiny['device'][0]:.4f} | {tiny['cpu'][0]:.4f} |" in markdown
    assert "failed:" not in markdown


def test_shellcheck_passes():
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    scripts = sorted(str(p) for p in (REPO / "bench").glob("*.sh"))
    result = subprocess.run([shellcheck, "-x", *scripts], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_on_device_switch_never_falls_back_to_interpret_mode(monkeypatch):
    """The switch the script sets: unset, every kernel is interpreted; naming a platform JAX is
    not on fails, so that the device check can never pass in interpret mode on the wrong host."""
    monkeypatch.delenv(cases.ON_DEVICE, raising=False)
    assert cases.interpret("gpu") is True
    assert cases.interpret("tpu", "params") == "params"
    for platform_name in ("gpu", "tpu"):
        monkeypatch.setenv(cases.ON_DEVICE, platform_name)
        with pytest.raises(RuntimeError, match="default backend is cpu"):
            cases.interpret(platform_name)
    monkeypatch.setenv(cases.ON_DEVICE, "cuda")
    with pytest.raises(ValueError, match="expected 'tpu' or 'gpu'"):
        cases.interpret("gpu")
