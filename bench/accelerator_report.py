"""bench/accelerator_check.py's results: one JSON file that each of the check's processes updates
after every section and every workload (so a run stopped part-way keeps what it measured), and
the markdown tables of docs/benchmarks.md's section "The day an accelerator is lent", written
beside it each time: machine, date and commit first; a tiny-mode run says that its numbers are
no timings."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable

from step_workloads import ETTIN_150M_TOKENS_PER_S  # bench/, beside this file

SECTIONS = ("self_check", "device_tests", "step_times")  # in the order they run


def path_for(stem: pathlib.Path, platform: str) -> pathlib.Path:
    """``<stem>-<platform>.json``: the stem is the parent's, the platform the children's."""
    return stem.with_name(f"{stem.name}-{platform}.json")


def load(path: pathlib.Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def save(path: pathlib.Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, default=float) + "\n")
    path.with_suffix(".md").write_text(markdown(results))


def update(path: pathlib.Path, change: Callable[[dict], None]) -> dict:
    """``change(results)`` on the results at ``path`` (none yet: {}), then the JSON and the
    markdown written; returns the results."""
    results = load(path)
    change(results)
    save(path, results)
    return results


def markdown(results: dict) -> str:
    """The tables of docs/benchmarks.md's accelerator section, from ``results``."""
    m = results.get("machine")
    if m:
        lines = [
            f"# accelerator check: {m['device_kind']} x{m['device_count']} ({m['platform']})", "",
            f"{m['date']}, commit {m['commit'][:12]}{' (dirty)' if m['dirty'] else ''}, host "
            f"{m['hostname']}, jax {m['jax']}, mode {results.get('mode')}",
        ]  # fmt: skip
    else:
        lines = ["# accelerator check: no device was probed", ""]
    if results.get("mode") == "tiny":
        lines += ["", "**Tiny mode: a test of this script, not accelerator timings.**"]
    lines += _device_time(results) + _self_check(results) + _steps(results)
    errors = [f"- failed: {reason}" for reason in failed(results)]
    errors += [f"- not run: {k}" for k in results.get("sections", SECTIONS) if k not in results]
    return "\n".join(lines + [""] + errors) + "\n"


def _device_time(results: dict) -> list[str]:
    estimate = results.get("estimate") or []
    measured = results.get("seconds", {})
    if not (estimate or measured):
        return []
    lines = ["", "| device time | estimated s | measured s |", "|---|---|---|"]
    for cost in estimate:
        seconds = measured.get(cost["key"])
        lines.append(f"| {cost['what']} | {cost['seconds']:.1f} | "
                     f"{'' if seconds is None else f'{seconds:.1f}'} |")  # fmt: skip
    for key, seconds in measured.items():
        if key not in {cost["key"] for cost in estimate}:
            lines.append(f"| {key} | | {seconds:.1f} |")
    total = sum(cost["seconds"] for cost in estimate)
    wall = results.get("wall_s")
    lines.append(f"| **in all** | {total:.1f} | {'' if wall is None else f'{wall:.1f}'} |")
    return lines


def _self_check(results: dict) -> list[str]:
    lines = ["", "| self-check | D | dtype | causal | passed | worst | s |", "|---" * 7 + "|"]
    for r in rows(results.get("self_check")):
        lines.append(f"| {r['kernel']} | {r['head_dim']} | {r['dtype']} | {r['causal']} | "
                     f"{r['passed']} | {r['describe']} | {r['seconds']:.1f} |")  # fmt: skip
    t = results.get("device_tests", {"error": "not run"})
    if "error" not in t:
        mode = "natively" if t["native"] else "in interpret mode"
        lines += ["", f"Attention equality tests {mode}: {t['passed']} passed, "
                  f"{t['failures']} failed, {t['errors']} errors, {t['skipped']} skipped "
                  f"({t['seconds']:.1f} s)."]  # fmt: skip
    return lines


def _steps(results: dict) -> list[str]:
    head = ("| workload | impl | dtype (params) | attention | batch | step s | instances/s | "
            "real tokens/s | TFLOP/s | MFU | compile s |")  # fmt: skip
    lines = ["", head, "|---" * 11 + "|"]
    packed, modern = [], []
    for r in rows(results.get("step_times")):
        if r.get("error"):
            lines.append(f"| {r['workload']} | {r['impl']} | | | {r['batch']} | {r['error']} "
                         "||||||")  # fmt: skip
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a (no peak)"
        dtypes = f"{r['dtype']} ({', '.join(r['param_dtypes'])})"
        lines.append(f"| {r['workload']} | {r['impl']} | {dtypes} | {r['attention']} | "
                     f"{r['batch']} | {r['step_s_median']:.4f} | {r['instances_per_s']:.1f} | "
                     f"{r['tokens_per_s']:.0f} | {r['achieved_flops_per_s'] / 1e12:.2f} | "
                     f"{mfu} | {r['compile_s']:.1f} |")  # fmt: skip
        if r.get("architecture") == "modernbert":
            ratio = r["tokens_per_s"] / ETTIN_150M_TOKENS_PER_S
            modern.append(f"{r['workload']}: {ratio:.2f}x Ettin-150M's published 0.30M real "
                          "tokens/s per H100")  # fmt: skip
        if r["instances"] != r["rows"] or r["efficiency"] < 1:
            packed.append(f"{r['workload']}: {r['instances'] / r['rows']:.2f} instances per row, "
                          f"{100 * r['efficiency']:.1f}% of the token slots real")  # fmt: skip
    if packed:
        lines += ["", "Rows: " + "; ".join(packed) + "."]
    if modern:
        lines += ["", "ModernBERT: " + "; ".join(modern) + "."]
    return lines


def failed(results: dict) -> list[str]:
    """Why the check failed, one reason each: a section or process that raised or stopped, a
    kernel that missed its tolerance, an equality test that failed, a workload with no row."""
    reasons = [f"{k}: {v['error']}" for k, v in results.items()
               if isinstance(v, dict) and "error" in v]  # fmt: skip
    reasons += [f"process {name}: {p['error']}"
                for name, p in results.get("processes", {}).items() if p.get("error")]  # fmt: skip
    reasons += [f"self_check: {r['describe']}" for r in rows(results.get("self_check"))
                if not r["passed"]]  # fmt: skip
    tests = results.get("device_tests", {})
    if tests.get("returncode"):
        reasons.append(f"device_tests: {tests.get('summary')}")
    reasons += [f"step_times {r['workload']} {r['impl']}: {r['error']}"
                for r in rows(results.get("step_times")) if r.get("error")]  # fmt: skip
    return reasons


def rows(section) -> list:
    """A section's rows; none when it raised."""
    return section if isinstance(section, list) else []
