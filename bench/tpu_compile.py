"""Compiles paper configs for TPU slices with ``python -m bertjax.compile`` and tabulates them.

    python bench/tpu_compile.py --preset=configs   # base/large x 128/512 x five slices
    python bench/tpu_compile.py --preset=attention # large x 128/512, xla vs fused, v5e-16/v4-32
    python bench/tpu_compile.py --preset=remat     # large 512 on v5litepod-16, every policy
    python bench/tpu_compile.py --preset=modernbert  # ModernBERT-base 1,024/8,192, local vs dense
    python bench/tpu_compile.py --row 'configs/large.py v5litepod-16 --config.model.dtype=...'

Every row is one ``python -m bertjax.compile --json`` subprocess (the real TPU compiler, on this
machine: nothing runs on a TPU), so a row's figures are exactly what a user sees. Results are
appended to ``--results`` (JSON lines, with the command) and printed as a markdown table:
fits, memory per chip, FLOPs and HBM bytes per chip and step (micro-batches x the compiler's
counts, which cover the accumulation loop's body once), arithmetic intensity, the roofline
bound max(FLOPs / peak, bytes / bandwidth) per step and per real token (an estimate from the
compiler's counts, not a timing) and the compile time. ``--reuse`` skips rows already in the
results file; ``--table`` compiles nothing and tabulates the rows of the presets that the
results file holds (naming the missing).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shlex
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
GIB = 1 << 30
SLICES = ("v4-8", "v4-32", "v5litepod-16", "v5p-8", "v6e-8")
CONFIGS = {  # name -> (config, overrides): the paper's two lengths, global batch 256; the
    # 128 rows are two_phase.py's phase 1 (128 / 20 predictions), 512 its phase 2 = the papers'.
    "base-512": ("configs/bert_base.py", ()),
    "base-128": ("configs/two_phase.py:base,1", ()),
    "large-512": ("configs/large.py", ()),
    "large-128": ("configs/two_phase.py:large,1", ()),
}
REMAT = ("none", "full", "dots", "dots_no_batch", "dots_attention", "attention")
# ModernBERT-base's two phases (configs/modernbert_base.py; their batches count packed rows).
# Phase 2 at phase 1's tokens per step (576 x 8,192 = 4,608 x 1,024), each in micro-batches of
# a similar size per chip: 36 x 1,024 (8 of them) and 4 x 8,192 (9); "dense" puts global
# attention on every layer (no local window).
MODERNBERT = {
    "modernbert-1024": (
        "configs/modernbert_base.py:base,1",
        ("--config.train.grad_accum_steps=8",),
    ),
    "modernbert-8192": (
        "configs/modernbert_base.py:base,2",
        ("--config.train.global_batch_size=576", "--config.train.grad_accum_steps=9"),
    ),
}


def preset_rows(name: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """(config file, topology, overrides) rows of a preset."""
    if name == "configs":
        return [(CONFIGS[c][0], s, CONFIGS[c][1]) for c in CONFIGS for s in SLICES]
    if name == "attention":
        return [
            (CONFIGS[c][0], s, (*CONFIGS[c][1], f"--config.model.attention_impl={impl}"))
            for c in ("large-512", "large-128")
            for s in ("v5litepod-16", "v4-32")
            for impl in ("xla", "fused")
        ]
    if name == "remat":
        rows = [("configs/large.py", "v5litepod-16", ("--config.model.attention_impl=xla",
                 "--config.model.remat_policy=dots"))]  # fmt: skip
        rows += [
            (
                "configs/large.py",
                "v5litepod-16",
                ("--config.model.attention_impl=fused", f"--config.model.remat_policy={policy}"),
            )  # fmt: skip
            for policy in REMAT
        ]
        return rows
    if name == "modernbert":
        dense = ("--config.model.global_attn_every_n_layers=1",)
        return [
            (config, s, (*overrides, *extra))
            for config, overrides in MODERNBERT.values()
            for s in ("v5litepod-16", "v4-32")
            for extra in ((), dense)
        ]
    raise SystemExit(f"unknown preset {name!r}: configs | attention | remat | modernbert")


def run_row(config: str, topology: str, overrides: tuple[str, ...]) -> dict:
    command = [sys.executable, "-m", "bertjax.compile", f"--config={config}",
               f"--topology={topology}", "--json", *overrides]  # fmt: skip
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    row = {"config": config, "topology": topology, "overrides": list(overrides)}
    row["command"] = "python -m bertjax.compile " + shlex.join(command[3:])
    row["wall_seconds"] = round(time.perf_counter() - started, 1)
    if result.returncode == 0:
        row.update(json.loads(result.stdout))
    else:
        row.update(fits=False, error=(result.stderr.strip().splitlines() or ["?"])[-1])
    return row


def _cell(row: dict) -> list[str]:
    settings = " ".join(o.removeprefix("--config.") for o in row["overrides"]) or "defaults"
    where = [row["config"], settings, row["topology"]]
    if "error" in row:
        return [*where, "", "", "no", row["error"].split(": ", 2)[-1], *[""] * 7,
                f"{row['wall_seconds']:.0f}"]  # fmt: skip
    mesh = "x".join(str(v) for v in row["mesh"].values())
    gib = lambda key: f"{row[key] / GIB:.2f}" if row.get(key) is not None else ""
    hbm, needed = row["hbm_bytes_per_chip"], row["needed_bytes"]
    if row.get("compiler_flops_per_chip") is None:  # did not fit: the compiler's figure only
        needs = f"needs {gib('needed_bytes')} of {gib('hbm_bytes_per_chip')}"
        return [*where, row["remat_policy"], mesh, "no", needs, *[""] * 7,
                f"{row['wall_seconds']:.0f}"]  # fmt: skip
    # Per step: rows before the micro-batch counts (micro_batches x the compiler's) were made
    # only without gradient accumulation, where the two agree.
    flops = row.get("step_flops_per_chip", row["compiler_flops_per_chip"])
    traffic = row.get("step_hbm_bytes_per_chip", row["compiler_hbm_bytes_per_chip"])
    per_token = row.get("bound_seconds_per_real_token")
    return [
        *where, row["remat_policy"], mesh, "yes" if row["fits"] else "no",
        f"{gib('params_bytes')} + {gib('optimizer_state_bytes')} + {gib('temp_bytes')} = "
        f"{gib('needed_bytes')} of {gib('hbm_bytes_per_chip')}",
        f"{100 * (1 - needed / hbm):.0f}%", f"{flops:.3g}", f"{traffic:.3g}",
        f"{row['arithmetic_intensity']:.0f} / {row['ridge_point']:.0f}",
        f"{1e3 * row['roofline_seconds']:.0f}",
        f"{1e9 * per_token:.1f}" if per_token else "", f"{row['compile_seconds']['train']:.0f}",
    ]  # fmt: skip


def table(rows: list[dict]) -> str:
    header = ["config", "overrides", "slice", "remat", "mesh", "fits",
              "GiB/chip: params + Adam + temp = needed of HBM", "headroom", "FLOPs/chip",
              "HBM bytes/chip", "FLOP/byte / ridge", "bound ms", "ns/real token",
              "compile s"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(r)) + " |" for r in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", action="append", default=[])
    parser.add_argument("--row", action="append", default=[], help="'CONFIG TOPOLOGY [OVERRIDES]'")
    parser.add_argument("--results", default=str(REPO / "bench/results/tpu_compile.jsonl"))
    parser.add_argument("--reuse", action="store_true")
    parser.add_argument("--table", action="store_true", help="tabulate --results, compile nothing")
    args = parser.parse_args()
    rows = [r for p in args.preset for r in preset_rows(p)]
    for text in args.row:
        config, topology, *overrides = shlex.split(text)
        rows.append((config, topology, tuple(overrides)))
    path = pathlib.Path(args.results)
    path.parent.mkdir(parents=True, exist_ok=True)
    done = {}
    if (args.reuse or args.table) and path.exists():
        for line in path.read_text().splitlines():
            r = json.loads(line)
            done[(r["config"], r["topology"], tuple(r["overrides"]))] = r
    results = []
    for key in rows:
        config, topology, overrides = key
        if args.table:
            if key in done:
                results.append(done[key])
            else:
                print(f"not compiled yet: {config} {topology} {' '.join(overrides)}", flush=True)
            continue
        row = done.get(key) or run_row(config, topology, overrides)
        if key not in done:
            with path.open("a") as f:
                f.write(json.dumps(row, sort_keys=True) + "\n")
        print(json.dumps({k: row.get(k) for k in ("topology", "fits", "overrides")}), flush=True)
        results.append(row)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
