"""Everything to run on the day a GPU or TPU is lent, one command: bench/accelerator_check.sh.

This process never imports JAX. It prints the device-time estimate (``bench/step_workloads.py``:
per item, with its constants and where they come from), then starts one process per framework,
one after the other, each doing all of that framework's work:

1. **bertjax** (``--child=bertjax``), on JAX's default backend:

   * ``self_check``: the fused kernel ``attention.resolve('fused', platform)`` against the XLA
     path (``bertjax.model.attention.self_check.compare``) at the shapes of
     ``step_workloads.SELF_CHECK_SHAPES``, dropout 0.1;
   * ``device_tests``: the kernels' equality tests (tests/model/attention/<platform>/
     flash_test.py ``-k equals_xla_path``), in this process through ``pytest.main``, with
     ``BERTJAX_ATTENTION_TESTS_ON_DEVICE=<platform>`` so that they run natively, not in Pallas
     interpret mode, under ``cases.assert_matches_xla``'s rule for native kernels; the counts
     come from pytest's JUnit XML;
   * ``step_times``, its workloads (``bench/step_workloads.py``; ``bench/step_frameworks.py``
     times them): the peers' fp32 contract, and configs/bert_base.py in bf16 as it ships, with
     rows of one padded instance or packed rows; on request (``--workloads=modern1024-bf16``)
     configs/modernbert_base.py's phase 1, beside Ettin-150M's published tokens per second.

2. **HF Flax** (``--child=hf-flax``): its ``step_times`` workloads, the harness's
   ``step_flax.py`` called once per workload in one process.

HF PyTorch is not part of the check: the peers' fp32 contract is compared with HF Flax, the
same compiler; a third process would not fit the 6 minutes.

Every process uses JAX's persistent compilation cache (``JAX_COMPILATION_CACHE_DIR``, default
``~/.cache/bertjax/jax_cache``), so a second run on the same machine (a rerun of a section
that failed, another ``--workloads``) skips the compiles the first one did.

Results: ``accelerator_check-<UTC time>-<platform>.json`` (every number) and ``.md`` (the tables)
in ``--out`` (default bench/results/), each with the machine, the date and the commit, rewritten
after every section and workload, so a run stopped by its lease keeps what it measured. They
hold the estimate beside what each item took. Exit status 1 when a section or process failed, a
kernel missed its tolerance, an equality test failed or a workload has no row; 2 without the
peers harness (``../shared/bench/peers`` beside the repository, or PEERS).

``--sections``, ``--workloads`` and ``--impls`` pick a part for a shorter slot (the estimate is
printed for the part); ``--estimate_only`` prints it and stops; ``--timeout`` bounds the whole
run (a process still running then is stopped, the rest are not started).

``--tiny`` is the CPU smoke mode the suite runs (tests/bench/accelerator_check_test.py): one
self-check shape, one interpret-mode equality case, a one-layer model for three steps in each
kind of workload, ``--peak_flops`` standing in for a chip's peak. Its numbers only show that the
check works: they are never timings.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform as host_platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

import accelerator_report as report  # bench/, beside this script
import step_workloads

REPO = pathlib.Path(__file__).resolve().parents[1]
# The peers harness: PEERS, else ../shared/bench/peers beside the checkout (or beside the folder of
# git worktrees the checkout is in).
_BESIDE = [base / "shared" / "bench" / "peers" for base in (REPO.parent, REPO.parents[1])]
PEERS = pathlib.Path(
    os.environ.get("PEERS") or next((p for p in _BESIDE if p.exists()), _BESIDE[0])
)
ON_DEVICE = "BERTJAX_ATTENTION_TESTS_ON_DEVICE"  # tests/model/attention/cases.py's switch
FRAMEWORKS = ("bertjax", "hf-flax")  # the order their processes run


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


def device_tests(platform: str, tiny: bool, scratch: pathlib.Path) -> dict:
    """The kernels' equality tests in this process, natively where the platform is 'tpu' or
    'gpu' (tiny, on CPU: one interpret-mode case)."""
    import pytest

    family = platform if platform in ("tpu", "gpu") else "tpu"
    selection = [f"tests/model/attention/{family}/flash_test.py", "-k", "equals_xla_path"]
    if tiny:  # one interpret-mode case (float32, length 128, no dropout; not the packed 384s)
        selection[-1] += " and 0.0 and not 200 and not 384 and not 512"
    native = platform in ("tpu", "gpu")
    if native:
        os.environ[ON_DEVICE] = platform
    xml = scratch / "device_tests.xml"
    began = time.perf_counter()
    options = ["-q", "-p", "no:cacheprovider", "-o", "addopts=", f"--rootdir={REPO}"]
    code = int(pytest.main([*options, f"--junitxml={xml}", *selection]))
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if xml.exists():
        for suite in ET.parse(xml).getroot().iter("testsuite"):
            for key in counts:
                counts[key] += int(suite.get(key, 0))
    else:
        counts["errors"] = 1
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    summary = (f"{counts['passed']} passed, {counts['failures']} failed, {counts['errors']} "
               f"errors, {counts['skipped']} skipped")  # fmt: skip
    print(f"device tests ({'native' if native else 'interpret mode'}): {summary}", flush=True)
    return {"platform": platform, "native": native, "selection": selection, "returncode": code,
            "seconds": time.perf_counter() - began, "summary": summary, **counts}  # fmt: skip


def _section(name: str, run):
    """A section's result and seconds, or {'error': ...}: one failing section does not lose the
    others."""
    began = time.perf_counter()
    try:
        result = run()
    except Exception as e:  # recorded in the results; the exit status says it failed
        print(f"{name} failed: {type(e).__name__}: {e}", flush=True)
        result = {"error": f"{type(e).__name__}: {e}"}
    seconds = time.perf_counter() - began
    print(f"{name}: {seconds:.1f} s", flush=True)
    return result, seconds


def child(framework: str, plan: dict, launched: float) -> int:
    """One framework's process: its sections and workloads, the results file updated after
    each."""
    import step_frameworks  # its imports count as start-up

    from bertjax.training import accelerators

    if framework == "hf-flax":  # start-up too (without it, step_flax.py's row says so)
        try:
            import transformers.models.bert.modeling_flax_bert  # noqa: F401
        except ImportError:
            pass
    probed = machine()
    path = report.path_for(pathlib.Path(plan["stem"]), probed["platform"])
    start_s = time.time() - launched
    print(f"{framework} process: started in {start_s:.1f} s on {probed['device_kind']}", flush=True)

    def begin(results):
        for key in ("mode", "sections", "estimate"):
            results.setdefault(key, plan[key])
        results.setdefault("machine", probed)
        results.setdefault("processes", {})[framework] = {"start_s": start_s}
        results.setdefault("seconds", {})[f"start:{framework}"] = start_s

    report.update(path, begin)
    tiny, scratch = plan["mode"] == "tiny", pathlib.Path(plan["scratch"])
    platform = probed["platform"]
    for name, run in (("self_check", lambda: self_check(platform, plan["shapes"])),
                      ("device_tests", lambda: device_tests(platform, tiny, scratch))):  # fmt: skip
        if framework == "bertjax" and name in plan["sections"]:
            result, seconds = _section(name, run)
            report.update(path, lambda r, n=name, v=result, s=seconds: _set(r, n, v, s))
    workloads = step_workloads.TINY_WORKLOADS if tiny else step_workloads.WORKLOADS
    peak, source = accelerators.peak_flops_per_device(plan["peak_flops"], probed["device_kind"])
    print(f"MFU's peak: {source}", flush=True)
    for name, impl in plan["steps"]:
        if step_workloads.framework(impl) != framework:
            continue
        if framework == "bertjax":
            row = step_frameworks.bertjax_row(name, impl, workloads[name], peak)
        else:
            row = step_frameworks.hf_flax_row(name, workloads[name], peak)
        report.update(path, lambda r, v=row: _set(r, "step_times", v, v["seconds"], append=True))
    print(f"{framework} process: done", flush=True)
    return 0


def _set(results: dict, key: str, value, seconds: float, append: bool = False) -> None:
    if append:
        results.setdefault(key, []).append(value)
        key = f"step:{value['workload']}:{value['impl']}"
    else:
        results[key] = value
    results.setdefault("seconds", {})[key] = seconds


def _parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    parser.add_argument("--tiny", action="store_true", help="the CPU smoke mode (module docstring)")
    parser.add_argument(
        "--timeout", type=float, default=600,
        help="seconds for the whole check: a process still running then is stopped, the rest "
        "not started, and the results say so (set it under the lease's own limit)",
    )  # fmt: skip
    sections = ",".join(report.SECTIONS)
    parser.add_argument("--sections", default=sections, help=f"comma-separated, of {sections}")
    parser.add_argument(
        "--workloads", default="", help="step_times' (default: those with default impls)"
    )
    parser.add_argument(
        "--impls", default="", help="of bertjax, bertjax-xla, hf-flax (default: the workload's "
        "default impls; all of them for a workload --workloads names)",
    )  # fmt: skip
    parser.add_argument(
        "--peak_flops", type=float, default=0.0,
        help="per-device peak for MFU (0: the chip table's dense bf16 peak; a CPU has none)",
    )  # fmt: skip
    parser.add_argument("--estimate_only", action="store_true", help="print the estimate, stop")
    parser.add_argument("--child", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)  # the child's: the parent's plan
    parser.add_argument("--launched", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.sections = [s for s in args.sections.split(",") if s]
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.impls = [i for i in args.impls.split(",") if i]
    known = step_workloads.TINY_WORKLOADS if args.tiny else step_workloads.WORKLOADS
    unknown = set(args.sections) - set(report.SECTIONS)
    unknown |= set(args.workloads) - set(known)
    unknown |= set(args.impls) - {impl for w in known.values() for impl in w.impls}
    if unknown:
        parser.error(f"unknown sections, workloads or impls: {', '.join(sorted(unknown))}")
    return args


def _plan(args, stem: pathlib.Path, scratch: pathlib.Path) -> dict:
    """What the children do, and the estimate they record beside what they measure."""
    tiny = args.tiny
    workloads = step_workloads.TINY_WORKLOADS if tiny else step_workloads.WORKLOADS
    steps = []
    if "step_times" in args.sections:
        steps = step_workloads.items(workloads, args.workloads, args.impls)
    shapes = step_workloads.TINY_SELF_CHECK_SHAPES if tiny else step_workloads.SELF_CHECK_SHAPES
    costs = [] if tiny else step_workloads.estimate(args.sections, steps, shapes)
    return {
        "mode": "tiny" if tiny else "full", "sections": args.sections, "steps": steps,
        "shapes": shapes, "peak_flops": args.peak_flops, "stem": str(stem),
        "scratch": str(scratch), "estimate": [vars(c) for c in costs],
    }  # fmt: skip


def _environment(scratch: pathlib.Path, workloads_file: pathlib.Path) -> dict:
    env = dict(os.environ, BENCH_WORKLOADS=str(workloads_file))
    env["BENCH_RESULTS"] = str(scratch / "harness_results")
    extra = [p for p in (os.environ.get("PYTHONPATH") or "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "bench"), str(PEERS), *extra])
    cache = pathlib.Path.home() / ".cache" / "bertjax" / "jax_cache"
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(cache))
    return env


def _run_child(framework: str, plan_file: pathlib.Path, env: dict, timeout: float) -> str | None:
    """Runs one framework's process (its output goes to ours) for at most ``timeout`` seconds;
    None, or why it failed."""
    if timeout <= 0:
        return "not started: --timeout reached"
    command = [sys.executable, __file__, f"--child={framework}", f"--plan={plan_file}",
               f"--launched={time.time()}"]  # fmt: skip
    try:
        result = subprocess.run(command, cwd=REPO, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"stopped after {timeout:.0f} s: --timeout reached"
    return None if result.returncode == 0 else f"exit status {result.returncode}"


def _finish(stem: pathlib.Path, plan: dict, failures: dict, child_s: float, wall: float) -> list:
    """The processes' failures and the wall time into the results (which a process that failed
    before probing the device never made: ``<stem>-unknown.json``); returns why it failed."""
    found = sorted(stem.parent.glob(f"{stem.name}-*.json"))
    path = found[0] if found else report.path_for(stem, "unknown")

    def finish(results):
        for key in ("mode", "sections", "estimate"):
            results.setdefault(key, plan[key])
        for framework, error in failures.items():
            results.setdefault("processes", {}).setdefault(framework, {})["error"] = error
        results["wall_s"] = wall
        results.setdefault("seconds", {})["orchestration"] = wall - child_s

    results = report.update(path, finish)
    print(f"results: {path}, {path.with_suffix('.md')}", flush=True)
    return report.failed(results)


def main(argv=None) -> int:
    began = time.perf_counter()
    args = _parse(argv)
    if args.child:
        return child(args.child, json.loads(pathlib.Path(args.plan).read_text()), args.launched)
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H%M%SZ")
    stem = pathlib.Path(args.out) / f"accelerator_check-{date}"
    with tempfile.TemporaryDirectory(prefix="accelerator_check.") as scratch_dir:
        scratch = pathlib.Path(scratch_dir)
        plan = _plan(args, stem, scratch)
        costs = [step_workloads.Cost(**c) for c in plan["estimate"]]
        print(step_workloads.describe(costs) if costs else "tiny mode: no device-time estimate "
              "(CPU; its numbers are no timings)", flush=True)  # fmt: skip
        total = sum(c.seconds for c in costs)
        if total > args.timeout:
            over = f"the estimate ({total:.0f} s) is over --timeout ({args.timeout:.0f} s)"
            print(f"accelerator_check: {over}: what does not fit will be stopped", flush=True)
        if args.estimate_only:
            return 0
        if not (PEERS / "common.py").exists():
            print(f"accelerator_check: no peers harness at {PEERS} (set PEERS)", file=sys.stderr)
            return 2
        plan_file = scratch / "plan.json"
        plan_file.write_text(json.dumps(plan))
        workloads_file = scratch / "workloads.json"
        step_workloads.write_harness_workloads(
            workloads_file, PEERS / "workloads.json", plan["steps"], args.tiny
        )
        env = _environment(scratch, workloads_file)
        failures, child_s = {}, 0.0
        frameworks = {step_workloads.framework(impl) for _, impl in plan["steps"]}
        if {"self_check", "device_tests"} & set(args.sections):
            frameworks.add("bertjax")
        for framework in (f for f in FRAMEWORKS if f in frameworks):
            started = time.perf_counter()
            error = _run_child(framework, plan_file, env, args.timeout - (started - began))
            child_s += time.perf_counter() - started
            if error:
                print(f"accelerator_check: {framework} process: {error}", flush=True)
                failures[framework] = error
        reasons = _finish(stem, plan, failures, child_s, time.perf_counter() - began)
    if reasons:
        print("accelerator_check: failed:\n  " + "\n  ".join(reasons), file=sys.stderr)
    return 1 if reasons else 0


if __name__ == "__main__":
    sys.exit(main())
