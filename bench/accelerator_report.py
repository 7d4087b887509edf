"""bench/accelerator_check.py's results as the markdown tables of docs/benchmarks.md's section
"The day an accelerator is lent": machine, date and commit first; a tiny-mode run says that its
numbers are no timings."""

from __future__ import annotations


def markdown(results: dict) -> str:
    """The tables of docs/benchmarks.md's accelerator section, from ``results``."""
    m = results["machine"]
    lines = [
        f"# accelerator check: {m['device_kind']} x{m['device_count']} ({m['platform']})",
        "",
        f"{m['date']}, commit {m['commit'][:12]}{' (dirty)' if m['dirty'] else ''}, host "
        f"{m['hostname']}, jax {m['jax']}, mode {results['mode']}",
    ]
    if results["mode"] == "tiny":
        lines += ["", "**Tiny mode: a test of this script, not accelerator timings.**"]
    lines += ["", "| self-check | D | dtype | causal | passed | worst | s |", "|---" * 7 + "|"]
    for r in rows(results.get("self_check")):
        lines.append(f"| {r['kernel']} | {r['head_dim']} | {r['dtype']} | {r['causal']} | "
                     f"{r['passed']} | {r['describe']} | {r['seconds']} |")  # fmt: skip
    t = results.get("device_tests", {"error": "not run"})
    if "error" not in t:
        mode = "natively" if t["native"] else "in interpret mode"
        lines += ["", f"Attention equality tests {mode}: {t['passed']} passed, "
                  f"{t['failures']} failed, {t['errors']} errors, {t['skipped']} skipped "
                  f"({t['seconds']} s)."]  # fmt: skip
    lines += ["", "| workload | impl | batch | step s | seq/s | TFLOP/s | MFU | compile s |"]
    lines.append("|---" * 8 + "|")
    for r in rows(results.get("step_times")):
        if r.get("error"):
            lines.append(f"| {r['workload']} | {r['impl']} | {r['batch']} | {r['error']} |||||")
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a (no chip)"
        lines.append(f"| {r['workload']} | {r['impl']} | {r['batch']} | {r['step_s_median']:.4f} "
                     f"| {r['sequences_per_s']:.1f} | {r['achieved_flops_per_s'] / 1e12:.2f} | "
                     f"{mfu} | {r['compile_s']:.1f} |")  # fmt: skip
    tiny = results.get("tiny_losses", {"error": "not run"})
    if "error" not in tiny:
        lines += ["", "| tiny.py step | loss on device | loss on CPU |", "|---|---|---|"]
        for step, device, cpu in zip(tiny["steps"], tiny["device"], tiny["cpu"], strict=True):
            lines.append(f"| {step} | {device:.4f} | {cpu:.4f} |")
    errors = [f"- failed: {k}: {v['error']}" for k, v in failed(results).items()]
    errors += [f"- not run: {k}" for k in SECTIONS if k not in results]
    return "\n".join(lines + [""] + errors) + "\n"


SECTIONS = ("self_check", "device_tests", "step_times", "tiny_losses")  # in the order they run


def failed(results: dict) -> dict:
    """The sections that raised: name -> {'error': ...}."""
    return {k: v for k, v in results.items() if isinstance(v, dict) and "error" in v}


def rows(section) -> list:
    """A section's rows; none when it raised."""
    return section if isinstance(section, list) else []
