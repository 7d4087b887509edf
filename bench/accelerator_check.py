"""Everything to run on the day a GPU or TPU is lent, one command: bench/accelerator_check.sh.

On JAX's default backend, in order, each in its own processes (this one never holds the
device), each recorded even when another fails:

1. ``self_check``: the fused kernel ``attention.resolve('fused', platform)`` against the XLA path
   (``bertjax.model.attention.self_check.compare``) at several head sizes, dtypes and masks.
2. ``device_tests``: the attention kernels' equality tests (tests/model/attention/<platform>/) with
   ``BERTJAX_ATTENTION_TESTS_ON_DEVICE=<platform>``, so the kernels run natively, not in Pallas
   interpret mode; the counts come from pytest's JUnit XML.
3. ``step_times``: the train step through the peers' harness (``bench/step_bertjax.py`` with
   ``--variant fused`` and ``--variant xlaattention``, and HF Flax's ``step_flax.py``, on
   workloads written here in its workloads.json format: BERT-base at 128 and BERT-large at 512,
   the peers' fp32 contract), each at the largest batch of a descending list that does not run
   out of memory; MFU is the harness's model FLOP/s over the chip's dense bf16 peak
   (``bertjax.training.accelerators.CHIPS``; none for a CPU).
4. ``tiny_losses``: ``python -m bertjax.main --config=configs/tiny.py`` for ``--tiny_steps`` steps
   on the device and again with ``JAX_PLATFORMS=cpu``; the losses of the log lines side by side.

Writes ``accelerator_check-<UTC time>-<platform>.json`` (every number) and ``.md`` (the tables)
to ``--out`` (default bench/results/), each with the machine, the date and the commit.

``--sections`` and ``--workloads`` pick a part (all of it took over 9 minutes on an H200 on
2026-11-26, most of it one compile per harness process: about 90 s each, six of them), so that a
short lease can run it in pieces; a part not run is listed as such. ``tiny_losses`` needs
TensorFlow (the data pipeline): a lent machine without it fails that section alone.

``--tiny`` is the CPU smoke mode the suite runs (tests/bench/accelerator_check_test.py): two
self-check shapes, one interpret-mode equality case, a one-layer model for a few steps, four
tiny.py steps at batch 8. Its numbers only show that the check works: they are never timings.
Needs the peers harness (``../shared/bench/peers`` beside the repository, or PEERS).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform as host_platform
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

import accelerator_report  # bench/, beside this script

REPO = pathlib.Path(__file__).resolve().parents[1]
# The peers harness: PEERS, else ../shared/bench/peers beside the checkout (or beside the folder of
# git worktrees the checkout is in).
_BESIDE = [base / "shared" / "bench" / "peers" for base in (REPO.parent, REPO.parents[1])]
PEERS = pathlib.Path(
    os.environ.get("PEERS") or next((p for p in _BESIDE if p.exists()), _BESIDE[0])
)
ON_DEVICE = "BERTJAX_ATTENTION_TESTS_ON_DEVICE"  # tests/model/attention/cases.py's switch

# (head_dim, dtype, causal) with attention dropout 0.1, as a pretraining run has it.
SELF_CHECK_SHAPES = [
    (64, "float32", False), (64, "bfloat16", False), (64, "bfloat16", True),
    (128, "float32", False), (128, "bfloat16", True), (32, "bfloat16", False),
]  # fmt: skip
TINY_SELF_CHECK_SHAPES = [(32, "float32", False), (32, "bfloat16", True)]
# name -> model shape and the batches to try, largest first (the first that fits is timed). Each
# try that runs out of memory costs a compile, so the lists start where an 80 GB card fits fp32:
# 256 x 128 is 32k tokens a step, past where a Hopper's matmuls saturate.
WORKLOADS = {
    "base128": dict(layers=12, hidden=768, heads=12, ffn=3072, seq=128,
                    batches=[256, 128, 64, 32, 16], warmup_steps=3, measure_steps=10),
    "large512": dict(layers=24, hidden=1024, heads=16, ffn=4096, seq=512,
                     batches=[64, 32, 16, 8, 4], warmup_steps=3, measure_steps=10),
}  # fmt: skip
TINY_WORKLOADS = {
    "tiny32": dict(layers=1, hidden=32, heads=2, ffn=64, seq=32, vocab_size=1100, n_masked=4,
                   batches=[4], warmup_steps=1, measure_steps=2),
}  # fmt: skip
# impl -> (runner, variant): the harness's own names for what it runs.
IMPLS = {
    "bertjax-fused": ("step_bertjax.py", "fused"),
    "bertjax-xla": ("step_bertjax.py", "xlaattention"),
    "hf-flax": ("step_flax.py", "jit"),
}
OUT_OF_MEMORY = re.compile(r"RESOURCE_EXHAUSTED|[Oo]ut of memory|\bOOM\b")
TRAIN_LINE = re.compile(r"^step (\d+)/\d+ loss (\S+)", re.MULTILINE)


def machine() -> dict:
    """The host, the devices JAX sees, the chip's table entry and the commit."""
    import jax

    from bertjax.training import accelerators

    device = jax.devices()[0]
    chip = accelerators.chip_for_device_kind(device.device_kind)
    git = lambda *a: subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True)
    return {
        "hostname": host_platform.node(),
        "platform": jax.default_backend(),
        "device_kind": device.device_kind,
        "device_count": jax.device_count(),
        "chip": chip.name if chip else None,
        "peak_bf16_flops": chip.peak_bf16_flops if chip else None,
        "jax": jax.__version__,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        # A lent machine gets a copy of the working tree without .git: BERTJAX_COMMIT says it.
        "commit": git("rev-parse", "HEAD").stdout.strip() or os.environ.get("BERTJAX_COMMIT", ""),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no").stdout.strip()),
    }


def self_check(platform: str, shapes) -> list[dict]:
    """One ``compare`` per shape of the kernel the platform resolves 'fused' to."""
    from bertjax.model import attention
    from bertjax.model.attention import self_check as check

    kernel = attention.resolve("fused", platform)
    rows = []
    for head_dim, dtype, causal in shapes:
        outcome = check.compare(
            kernel, head_dim=head_dim, dtype=dtype, dropout_rate=0.1, causal=causal
        )
        rows.append({**outcome.to_dict(), "describe": outcome.describe()})
        verdict = "ok" if outcome.passed else "FAILED"
        print(f"self-check {kernel} D={head_dim} {dtype} causal={causal}: {verdict}, "
              f"{outcome.describe()}", flush=True)  # fmt: skip
    return rows


def device_tests(platform: str, selection: list[str], scratch: pathlib.Path) -> dict:
    """pytest on ``selection``, natively on ``platform`` when it is 'tpu' or 'gpu'."""
    report = scratch / "device_tests.xml"
    env = dict(os.environ, PYTHONPATH=_path(REPO))
    native = platform in ("tpu", "gpu")
    if native:
        env[ON_DEVICE] = platform
    began = time.perf_counter()
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    result = subprocess.run(
        [*command, f"--junitxml={report}", *selection],
        cwd=REPO, env=env, capture_output=True, text=True,
    )  # fmt: skip
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if report.exists():
        for suite in ET.parse(report).getroot().iter("testsuite"):
            for key in counts:
                counts[key] += int(suite.get(key, 0))
    else:
        counts["errors"] = 1
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    tail = result.stdout.strip().splitlines()[-1:] or result.stderr.strip().splitlines()[-1:]
    print(f"device tests ({'native' if native else 'interpret mode'}): {tail}", flush=True)
    return {
        "platform": platform, "native": native, "selection": selection,
        "returncode": result.returncode, "seconds": round(time.perf_counter() - began, 1),
        "summary": tail[0] if tail else "", **counts,
    }  # fmt: skip


def _path(*entries) -> str:
    extra = os.environ.get("PYTHONPATH")
    return os.pathsep.join([*(str(e) for e in entries), *([extra] if extra else [])])


def _workloads_file(workloads: dict, scratch: pathlib.Path) -> pathlib.Path:
    """The peers' workloads.json with one workload per (name, batch): ``<name>_b<batch>``."""
    spec = json.loads((PEERS / "workloads.json").read_text())
    entries = {}
    for name, shape in workloads.items():
        for batch in shape["batches"]:
            entry = {k: v for k, v in shape.items() if k != "batches"}
            desc = f"{name} batch {batch} (bench/accelerator_check.py)"
            entries[f"{name}_b{batch}"] = {**entry, "batch": batch, "desc": desc}
    path = scratch / "workloads.json"
    path.write_text(json.dumps({"common": spec["common"], "workloads": entries}, indent=1))
    return path


def _run_step(impl: str, workload: str, workloads_file, scratch, timeout: float) -> dict:
    """One harness run: its steps.jsonl record, or {'error': ...} ('out of memory' for OOM)."""
    runner, variant = IMPLS[impl]
    script = REPO / "bench" / runner if runner == "step_bertjax.py" else PEERS / runner
    results = scratch / f"results_{impl}_{workload}"
    env = dict(os.environ, BENCH_WORKLOADS=str(workloads_file), BENCH_RESULTS=str(results))
    env["PYTHONPATH"] = _path(REPO, PEERS)
    command = [sys.executable, str(script), "--workload", workload, "--variant", variant]
    try:
        result = subprocess.run(command, cwd=PEERS, env=env, capture_output=True, text=True,
                                timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    records = (results / "steps.jsonl").read_text().splitlines() if results.exists() else []
    if result.returncode == 0 and records:
        return json.loads(records[-1])
    output = result.stderr + result.stdout
    if OUT_OF_MEMORY.search(output):
        return {"error": "out of memory"}
    lines = [line for line in output.strip().splitlines() if line.strip()]
    skipped = json.loads(records[-1]).get("skipped") if records else None
    return {"error": skipped or (lines[-1] if lines else f"exit {result.returncode}")}


def step_times(workloads: dict, peak_flops, scratch: pathlib.Path, timeout: float) -> list[dict]:
    """Per workload and impl: the largest batch that fits, timed by the harness, with MFU."""
    workloads_file = _workloads_file(workloads, scratch)
    rows = []
    for name, shape in workloads.items():
        for impl in IMPLS:
            tried = []
            for batch in shape["batches"]:
                record = _run_step(impl, f"{name}_b{batch}", workloads_file, scratch, timeout)
                tried.append({"batch": batch, "error": record.get("error")})
                if record.get("error") != "out of memory":
                    break
            row = {"workload": name, "impl": impl, "batch": batch, "tried": tried,
                   "error": record.get("error")}  # fmt: skip
            if "error" not in record:
                flops = record["achieved_flops_per_s"]
                row.update(
                    step_s_median=record["step_s_median"],
                    step_s_min=record["step_s_min"],
                    sequences_per_s=batch / record["step_s_median"],
                    tokens_per_s=record["tokens_per_s"],
                    achieved_flops_per_s=flops,
                    mfu=flops / peak_flops if peak_flops else None,
                    compile_s=record.get("compile_s"),
                    loss_last=record["loss_last"],
                )
            print(f"step {name} {impl}: {row.get('error') or row['step_s_median']}", flush=True)
            rows.append(row)
    return rows


def _tiny_run(steps: int, flags: list, workdir: pathlib.Path, cpu: bool) -> subprocess.Popen:
    """``configs/tiny.py`` for ``steps`` steps with more ``flags``, started (on CPU if ``cpu``)."""
    env = dict(os.environ, PYTHONPATH=_path(REPO))
    if cpu:
        env["JAX_PLATFORMS"] = "cpu"
    command = [
        sys.executable, "-m", "bertjax.main", "--config=configs/tiny.py", f"--workdir={workdir}",
        f"--config.train.num_steps={steps}", f"--config.train.log_every={max(1, steps // 6)}",
        "--config.train.eval_every=0", *flags,
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _losses(run: subprocess.Popen, where: str, timeout: float) -> tuple[list, list]:
    """(steps, losses) of the run's log lines."""
    stdout, stderr = run.communicate(timeout=timeout)
    if run.returncode != 0:
        raise RuntimeError(f"tiny run on {where} failed: {stderr.strip().splitlines()[-3:]}")
    found = TRAIN_LINE.findall(stdout)
    return [int(s) for s, _ in found], [float(loss) for _, loss in found]


def tiny_losses(steps: int, flags: list, scratch: pathlib.Path, timeout: float) -> dict:
    """configs/tiny.py on the device and on CPU: the logged losses at the same steps. The two
    runs go at once: the CPU one does not use the device, and the device one mostly waits."""
    device_run = _tiny_run(steps, flags, scratch / "tiny_device", cpu=False)
    cpu_run = _tiny_run(steps, flags, scratch / "tiny_cpu", cpu=True)
    try:
        device_steps, device = _losses(device_run, "the device", timeout)
        cpu_steps, cpu = _losses(cpu_run, "CPU", timeout)
    finally:
        for run in (device_run, cpu_run):
            if run.poll() is None:  # the other run failed or timed out
                run.kill()
    if device_steps != cpu_steps or not device_steps:
        raise RuntimeError(f"logged steps differ: device {device_steps}, cpu {cpu_steps}")
    difference = max(abs(d - c) for d, c in zip(device, cpu, strict=True))
    print(f"tiny.py losses, device vs cpu: largest difference {difference:.4f}", flush=True)
    return {"steps": device_steps, "device": device, "cpu": cpu, "max_abs_difference": difference}


def _section(name: str, run) -> dict | list:
    """A section's result, or {'error': ...}: one failing section does not lose the others."""
    began = time.perf_counter()
    try:
        result = run()
    except Exception as e:  # recorded in the results, the exit status says it failed
        print(f"{name} failed: {type(e).__name__}: {e}", flush=True)
        return {"error": f"{type(e).__name__}: {e}"}
    print(f"{name}: {time.perf_counter() - began:.1f} s", flush=True)
    return result


def _probe(tiny: bool, sections: list, scratch: pathlib.Path) -> dict:
    """``machine`` and ``self_check`` from a child process: this one never holds the device, so
    the children after it can (a TPU takes one process at a time; a GPU process keeps what its
    allocator took)."""
    path = scratch / "probe.json"
    command = [sys.executable, __file__, f"--probe={path}", f"--sections={','.join(sections)}"]
    command += ["--tiny"] * tiny
    result = subprocess.run(command, capture_output=True, text=True)
    print(result.stdout, end="", flush=True)
    if result.returncode != 0 or not path.exists():
        raise SystemExit(f"accelerator_check: the device probe failed:\n{result.stderr[-3000:]}")
    return json.loads(path.read_text())


def _checks(results: dict, args, scratch, save) -> None:
    """``args.sections`` after the probe, each in child processes, into ``results``; ``save()``
    after each, so a run stopped part-way (a lease's time limit) keeps what it measured."""
    tiny, sections, timeout = args.tiny, args.sections, args.timeout
    platform = results["machine"]["platform"]
    family = platform if platform in ("tpu", "gpu") else "tpu"
    selection = [f"tests/model/attention/{family}/flash_test.py", "-k", "equals_xla_path"]
    if tiny:  # one interpret-mode case (float32, length 128, no dropout; not the packed 384s)
        selection[-1] += " and 0.0 and not 200 and not 384"
    if "device_tests" in sections:
        results["device_tests"] = _section(
            "device tests", lambda: device_tests(platform, selection, scratch)
        )
        save()
    peak = results["machine"]["peak_bf16_flops"]
    workloads = TINY_WORKLOADS if tiny else WORKLOADS
    workloads = {k: v for k, v in workloads.items() if not args.workloads or k in args.workloads}
    if "step_times" in sections:
        results["step_times"] = _section(
            "step times", lambda: step_times(workloads, peak, scratch, timeout)
        )
        save()
    flags = ["--config.train.global_batch_size=8"] if tiny else []  # tiny: a test, not a run
    if "tiny_losses" in sections:
        results["tiny_losses"] = _section(
            "tiny losses", lambda: tiny_losses(args.tiny_steps, flags, scratch, timeout)
        )


def _write(results: dict, out: pathlib.Path, date: str) -> pathlib.Path:
    """``<out>/accelerator_check-<UTC time>-<platform>.{json,md}`` (the time the run began);
    returns the stem. Sections not run yet are absent from both."""
    out.mkdir(parents=True, exist_ok=True)
    stamp = date.replace("+00:00", "Z").replace(":", "")
    stem = out / f"accelerator_check-{stamp}-{results['machine']['platform']}"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    stem.with_suffix(".md").write_text(accelerator_report.markdown(results))
    print(f"results: {stem}.json, {stem}.md", flush=True)
    return stem


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    parser.add_argument("--tiny", action="store_true", help="the CPU smoke mode (module docstring)")
    parser.add_argument("--tiny_steps", type=int, help="configs/tiny.py steps (300; tiny: 4)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per subprocess")
    parser.add_argument(
        "--sections", default=",".join(accelerator_report.SECTIONS),
        help="comma-separated, of " + ",".join(accelerator_report.SECTIONS) + " (default all: "
        "about 12 minutes on an H200, 2026-11-26; split them where a lease is shorter)",
    )  # fmt: skip
    parser.add_argument("--workloads", default="", help="step_times' workloads (default all)")
    parser.add_argument("--probe", help=argparse.SUPPRESS)  # the child of _probe: its JSON file
    args = parser.parse_args()
    args.sections = [s for s in args.sections.split(",") if s]
    args.workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(args.sections) - set(accelerator_report.SECTIONS)
    unknown |= set(args.workloads) - set(TINY_WORKLOADS if args.tiny else WORKLOADS)
    if unknown:
        parser.error(f"unknown sections or workloads: {', '.join(sorted(unknown))}")
    args.tiny_steps = args.tiny_steps or (4 if args.tiny else 300)
    shapes = TINY_SELF_CHECK_SHAPES if args.tiny else SELF_CHECK_SHAPES
    if args.probe:
        probed = {"machine": machine()}
        platform = probed["machine"]["platform"]
        if "self_check" in args.sections:
            probed["self_check"] = _section("self-check", lambda: self_check(platform, shapes))
        pathlib.Path(args.probe).write_text(json.dumps(probed, default=float))
        return 0
    if not (PEERS / "common.py").exists():
        print(f"accelerator_check: no peers harness at {PEERS} (set PEERS)", file=sys.stderr)
        return 2
    results = {"mode": "tiny" if args.tiny else "full"}
    with tempfile.TemporaryDirectory(prefix="accelerator_check.") as scratch:
        results.update(_probe(args.tiny, args.sections, pathlib.Path(scratch)))
        began = results["machine"]["date"]
        save = lambda: _write(results, pathlib.Path(args.out), began)
        save()
        _checks(results, args, pathlib.Path(scratch), save)
    save()
    failed = list(accelerator_report.failed(results))
    failed += ["self_check"] * any(
        not r["passed"] for r in accelerator_report.rows(results.get("self_check"))
    )
    failed += ["device_tests"] * bool(results.get("device_tests", {}).get("returncode"))
    if failed:
        print(f"accelerator_check: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
