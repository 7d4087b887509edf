"""bench/accelerator_check.sh: its device-time estimate (within the 6 minutes, its constants the
H200 log's figures), and the whole check on CPU in its tiny mode (one process per framework,
interpret-mode kernels, one-layer models), whose results must agree with references: the
commit, the first loss of an untrained model, the shipped config's dtypes in the compiled step,
packed rows counted by the step as on the host, the peers' FLOP count behind MFU. Also: shellcheck
passes it, and the tests' switch to native kernels refuses to run where the device is not."""

import importlib.util
import json
import math
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys

import pytest

from tests import cpu_xla
from tests.model.attention import cases

REPO = pathlib.Path(__file__).parents[2]
SCRIPT = REPO / "bench" / "accelerator_check.sh"
H200 = REPO / "bench" / "results" / "h200-2026-11-26"
PEAK = 1e12  # --peak_flops in tiny mode: a CPU has no chip-table peak
pytestmark = pytest.mark.xdist_group("accelerator_check_test")  # one tiny run for the module


def _check(*flags: str, timeout: float = 600) -> subprocess.CompletedProcess:
    # One CPU device, as a run; JAX_PLATFORMS: no libtpu probe.
    env = cpu_xla.environ(1, JAX_PLATFORMS="cpu")
    command = ["bash", str(SCRIPT), *flags]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)


def _bench_module(name: str):
    sys.path.insert(0, str(REPO / "bench"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(REPO / "bench"))


def test_default_run_estimates_at_most_six_minutes_of_one_gpu():
    result = _check("--estimate_only", timeout=60)
    assert result.returncode == 0, result.stderr
    head, *items = result.stdout.strip().splitlines()
    total = float(re.match(r"estimated device time: (\d+) s", head).group(1))
    seconds = [float(line.split()[0]) for line in items]
    assert total <= 360 and "within the 360 s budget" in head, result.stdout
    assert abs(total - sum(seconds)) <= 0.5, result.stdout
    for what in ("bertjax process start", "self_check, 4 shapes", "device_tests",
                 "base128-fp32 bertjax", "base512-bf16 bertjax", "base512-bf16-packed bertjax",
                 "hf-flax process start", "base128-fp32 hf-flax"):  # fmt: skip
        assert sum(what in line for line in items) == 1, (what, result.stdout)
    shorter = _check("--estimate_only", "--sections=device_tests", timeout=60).stdout
    assert re.match(r"estimated device time: 57 s", shorter), shorter  # 2 + 20 + 35.1
    # ModernBERT-base's phase 1, outside the default run: 2 + 20 + build 100 + 13 x 0.109 s.
    modern = _check(
        "--estimate_only", "--sections=step_times", "--workloads=modern1024-bf16", timeout=60
    )
    assert re.match(r"estimated device time: 123 s", modern.stdout), modern.stdout + modern.stderr
    assert "modern1024-bf16 bertjax: build + 13 steps" in modern.stdout


def test_estimate_constants_are_the_h200_logs_figures():
    """The constants the estimate is made of, against the H200 run's own files."""
    workloads = _bench_module("step_workloads")
    run = json.loads(next(H200.glob("accelerator_check-*-gpu.json")).read_text())
    for row in run["self_check"]:
        shape = (row["head_dim"], row["dtype"], row["causal"])
        assert workloads.SELF_CHECK_S[shape] == round(row["seconds"], 1), shape
    log = (H200 / "log.txt").read_text()
    assert workloads.DEVICE_TESTS_S == round(float(re.search(r"in ([\d.]+)s", log)[1]), 1)
    for impl, key in (("bertjax-fused", "base128"),):
        step = float(re.search(rf"step {key} {impl}: ([\d.]+)", log)[1])
        assert workloads.STEP_S[("bertjax", key)] == round(step, 3)
    step = float(re.search(r"step base128 hf-flax: ([\d.]+)", log)[1])
    assert workloads.STEP_S[("hf-flax", "base128")] == round(step, 3)
    # HF Flax's build holds its first step, BERT-large's measured; the rest is model init.
    (hf_large,) = [r for r in json.loads((H200 / "large512_rest.json").read_text())
                   if r["impl"] == "hf-flax"]  # fmt: skip
    assert workloads.BUILD_S[("hf-flax", "large")] >= hf_large["compile_s"]


def _head() -> str:
    git = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True)
    return git.stdout.decode().strip()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(results, markdown) of one tiny run, and the commits checked out before and after it."""
    out = tmp_path_factory.mktemp("accelerator_check")
    before = _head()
    result = _check("--tiny", f"--out={out}", f"--peak_flops={PEAK}")
    if result.returncode == 2 and "no peers harness" in result.stderr:
        pytest.skip(result.stderr.strip())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (json_path,) = out.glob("accelerator_check-*-cpu.json")
    results = json.loads(json_path.read_text())
    return results, json_path.with_suffix(".md").read_text(), {before, _head()}


def test_tiny_run_records_the_machine_and_every_section(tiny):
    results, markdown, commits = tiny
    machine = results["machine"]
    assert machine["commit"] in commits  # (a commit may land in a shared checkout meanwhile)
    assert machine["hostname"] == platform.node()
    assert (machine["platform"], machine["device_count"], machine["chip"]) == ("cpu", 1, None)
    assert results["mode"] == "tiny" and results["estimate"] == []
    assert "Tiny mode: a test of this script, not accelerator timings." in markdown
    assert "failed:" not in markdown and "not run:" not in markdown

    (row,) = results["self_check"]
    assert (row["head_dim"], row["dtype"], row["causal"]) == (32, "bfloat16", True)
    assert row["kernel"] == "tpu_interpret" and row["passed"], row
    assert 0 <= row["kernel_error"] <= row["allowed"] and row["seconds"] > 0
    assert "| tpu_interpret | 32 | bfloat16 | True | True |" in markdown
    tests = results["device_tests"]
    assert (tests["native"], tests["tests"], tests["passed"], tests["failures"]) == (False, 1, 1, 0)
    assert "Attention equality tests in interpret mode: 1 passed, 0 failed" in markdown

    # One process per framework, each timed; every item of the run has its seconds.
    assert sorted(results["processes"]) == ["bertjax", "hf-flax"]
    steps = [f"step:{r['workload']}:{r['impl']}" for r in results["step_times"]]
    assert sorted(results["seconds"]) == sorted(
        ["start:bertjax", "self_check", "device_tests", *steps, "start:hf-flax", "orchestration"]
    )
    assert all(seconds >= 0 for seconds in results["seconds"].values())
    assert results["wall_s"] >= sum(results["seconds"].values()) - 0.5


def _harness_flops(layers, hidden, ffn, length, predictions, rows, vocab=1100) -> float:
    """The peers' harness's count of a step's model FLOPs: every position of every layer."""
    peers = os.environ.get("PEERS") or str(REPO.parent / "shared" / "bench" / "peers")
    if peers not in sys.path:
        sys.path.insert(0, peers)
    import common  # noqa: PLC0415 - the peers harness, present: the tiny run needs it

    shape = dict(layers=layers, hidden=hidden, ffn=ffn, seq=length, vocab_size=vocab,
                 batch=rows, n_masked=predictions, max_position_embeddings=512,
                 type_vocab_size=2)  # fmt: skip
    return common.model_flops(shape)["model_flops_per_step"]


def _reference_flops(layers, hidden, ffn, length, predictions, rows) -> float:
    """The harness's count less what bertjax's last layer skips: its queries, output
    projection, FFN and attention at the L - (1 + P) positions no head reads, forward and
    backward."""
    full = _harness_flops(layers, hidden, ffn, length, predictions, rows)
    skipped = length - 1 - predictions
    per_position = 2 * (2 * hidden**2 + 2 * hidden * ffn) + 4 * length * hidden
    return full - rows * 3 * skipped * per_position


def test_tiny_rows_hold_the_shipped_dtypes_packed_rows_and_mfu(tiny):
    results, markdown, _ = tiny
    rows = {(r["workload"], r["impl"]): r for r in results["step_times"]}
    assert sorted(rows) == [("tiny32-bf16", "bertjax"), ("tiny32-bf16-packed", "bertjax"),
                            ("tiny32-fp32", "bertjax"), ("tiny32-fp32", "hf-flax"),
                            ("tiny64-modern", "bertjax")]  # fmt: skip
    modern = rows.pop(("tiny64-modern", "bertjax"))
    # ModernBERT's recipe as configs/modernbert_base.py ships it, packed: an untrained model's
    # MLM loss alone (no NSP), bf16 matmuls, what the device counted is what the host packed.
    assert modern["error"] is None and modern["architecture"] == "modernbert", modern
    assert abs(modern["loss_first"] - math.log(1100)) < 0.5, modern
    assert modern["dtype"] == "bfloat16" and modern["dot_dtypes"].get("bf16", 0) > 20, modern
    assert modern["instances"] > 4 and modern["tokens"] <= 4 * 64
    assert (modern["step_instances"], modern["step_tokens"]) == (
        modern["instances"], modern["tokens"])  # fmt: skip
    flops = modern["model_flops_per_step"]
    assert math.isclose(modern["mfu"], flops / modern["step_s_median"] / PEAK, rel_tol=1e-6)
    assert "| tiny64-modern | bertjax | bfloat16 (" in markdown
    assert re.search(r"ModernBERT: tiny64-modern: [\d.]+x Ettin-150M's published", markdown)
    spec = importlib.util.spec_from_file_location("shipped", REPO / "configs" / "bert_base.py")
    shipped = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shipped)
    model = shipped.get_config().model
    for (workload, impl), row in rows.items():
        assert row["error"] is None and row["batch"] == 4, row
        assert 0 < row["step_s_min"] <= row["step_s_median"] < 10
        # An untrained model's MLM + NSP loss: ln(vocab) + ln(2).
        assert abs(row["loss_first"] - (math.log(1100) + math.log(2))) < 0.5, row
        flops = _reference_flops(1, 32, 64, 32, 4, 4)
        assert math.isclose(row["model_flops_per_step"], flops, rel_tol=1e-9), row
        assert math.isclose(row["mfu"], flops / row["step_s_median"] / PEAK, rel_tol=1e-6)
        mfu = f"{100 * row['mfu']:.1f}%"
        assert f"| {workload} | {impl} | {row['dtype']} (" in markdown and mfu in markdown
        if workload == "tiny32-fp32":  # the peers' contract: fp32 throughout
            assert (row["dtype"], row["param_dtypes"]) == ("float32", ["float32"]), row
            assert set(row.get("dot_dtypes") or {"f32": 1}) == {"f32"}, row
            assert (row["instances"], row["tokens"]) == (4, 4 * 32)
            continue
        # As configs/bert_base.py ships: its compute dtype in the compiled step's matmuls, its
        # param dtype in the state.
        assert (row["dtype"], row["param_dtypes"]) == (model.dtype, [model.param_dtype]), row
        assert model.dtype == "bfloat16" and row["dot_dtypes"].get("bf16", 0) > 20, row
        # What the step counted on the device is what the host put in the rows.
        assert (row["step_instances"], row["step_tokens"]) == (row["instances"], row["tokens"])
        assert row["efficiency"] == row["tokens"] / (4 * 32) and row["tokens"] < 4 * 32
    assert rows[("tiny32-bf16", "bertjax")]["instances"] == 4  # one instance per row, padded
    assert rows[("tiny32-bf16-packed", "bertjax")]["instances"] > 4  # several
    assert "tiny32-bf16-packed: 1." in markdown and "instances per row" in markdown
    hf, ours = rows[("tiny32-fp32", "hf-flax")], rows[("tiny32-fp32", "bertjax")]
    full = _harness_flops(1, 32, 64, 32, 4, 4)
    assert hf["harness_flops_per_step"] == ours["harness_flops_per_step"] == full


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
