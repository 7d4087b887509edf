"""The paper miniature's report: ``OUT/results/*.json`` -> Markdown tables in the layout of
docs/paper_miniature.md.

    python -m bench.paper.report --out_dir=OUT [--output=FILE.md]   # default: print

Only what the runs wrote is shown (``bench.paper.run`` writes one results file per finished
run); a plan run without one is listed under "Missing runs", and its cells say ``missing``, or
``not run: gate/T failed`` for a run that waits, through the runs it reads (``after`` in
plan.json), for a gate that failed.
Tables follow the paper's layout, the paper's own numbers (BERT-BASE) beside the miniature's:

- Table 5 (pretraining tasks): dev score per task, mean ± sample standard deviation over the
  restarts at the learning rate whose mean is best (the paper selects the best single run; its
  best is shown too), for BERT, No NSP, LTR & No NSP, + BiLSTM, no pretraining and the continued
  public checkpoint.
- Table 6 (model size): held-out MLM accuracy and perplexity (exp of the MLM loss) at the end of
  pretraining, and the fine-tuned dev scores, per (L, H, A).
- Table 7 (feature-based, NER): fine-tuning against the six layer combinations.
- Curves: held-out MLM / LTR accuracy against pretraining steps, and the dev score of models
  fine-tuned from intermediate steps (tables, and with ``--output=NAME.md`` a plot,
  ``NAME_curves.png`` beside it, when matplotlib is installed).

Each table names the runs' machine, dates, commit and the command that made them. A scale other
than ``full`` is headed as a plumbing check, not a finding. ``--reading=FILE`` puts a person's
reading of the tables (which of the paper's orderings reproduce, which do not, and why) under the
title; the tables never contain prose.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys

from bertjax import atomic

# The paper's dev numbers, BERT-BASE (Devlin et al., 2019, Tables 5-7).
PAPER_TABLE5 = {  # model -> (QNLI dev accuracy, SQuAD v1.1 dev F1)
    "bert": (88.4, 88.5),
    "no_nsp": (84.9, 87.9),
    "ltr": (84.3, 77.8),
    "bilstm": (84.1, 84.9),
}
PAPER_TABLE6 = {  # (L, H, A) -> (LM ppl, MNLI-m dev accuracy)
    (3, 768, 12): (5.84, 77.9),
    (6, 768, 3): (5.24, 80.6),
    (6, 768, 12): (4.68, 81.9),
    (12, 768, 12): (3.99, 84.4),
    (12, 1024, 16): (3.54, 85.7),
    (24, 1024, 16): (3.23, 86.6),
}
PAPER_TABLE7 = {  # CoNLL-2003 dev F1, BERT-BASE
    "fine-tuning": 96.4,
    "embeddings": 91.0,
    "second_to_last": 95.6,
    "last": 94.9,
    "last_four_sum": 95.9,
    "last_four_concat": 96.1,
    "all_sum": 95.5,
}
TABLE5_ROWS = (  # (label, results name prefix, model)
    ("BERT (MLM + NSP)", "finetune", "bert"),
    ("No NSP", "finetune", "no_nsp"),
    ("LTR & No NSP", "finetune", "ltr"),
    ("+ BiLSTM", "bilstm", "ltr"),
    ("No pretraining (random init)", "finetune", "no_pretraining"),
    ("all-MiniLM-L6-v2 continued (ceiling)", "finetune", "minilm_continued"),
)
TASK_COLUMNS = ("qnli", "squad", "wnut16")


def load(out_dir: str) -> tuple[dict, dict]:
    """(plan.json, {run name: results record}) of ``out_dir``; a ValueError if it has no plan."""
    plan_file = os.path.join(out_dir, "plan.json")
    if not os.path.exists(plan_file):
        raise ValueError(f"--out_dir={out_dir}: no plan.json (run python -m bench.paper.run first)")
    with open(plan_file, encoding="utf-8") as f:
        plan = json.load(f)
    records = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "results", "*.json"))):
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        records[record["name"]] = record
    return plan, records


def failed_gates(out_dir: str) -> dict:
    """{gate name: the verdict record of a gate that failed} (``plan.failed_gate_path``)."""
    failed = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "failed_gates", "*.json"))):
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        failed[record["name"]] = record
    return failed


def sample_std(scores: list[float]) -> float:
    """The sample standard deviation (n - 1), 0 for one score."""
    if len(scores) < 2:
        return 0.0
    mean = sum(scores) / len(scores)
    return math.sqrt(sum((s - mean) ** 2 for s in scores) / (len(scores) - 1))


def sweep_summary(sweep: dict) -> dict:
    """Per learning rate the dev scores over seeds; the rate with the best mean, its mean and
    sample standard deviation (0 for one seed), its number of seeds, and the best single run."""
    by_rate: dict[float, list[float]] = {}
    for row in sweep["rows"]:
        by_rate.setdefault(float(row["learning_rate"]), []).append(float(row["score"]))
    means = {rate: sum(s) / len(s) for rate, s in by_rate.items()}
    rate = max(means, key=lambda r: (means[r], -list(by_rate).index(r)))
    scores = by_rate[rate]
    best = max(float(r["score"]) for r in sweep["rows"])
    return {
        "learning_rate": rate,
        "mean": means[rate],
        "std": sample_std(scores),
        "seeds": len(scores),
        "best": best,
        "metric": sweep["primary_metric"],
    }


def waiting(plan: dict, failed: dict) -> dict:
    """{run name: the failed gate it waits for, directly or through the runs it reads}."""
    after = {r["name"]: r.get("after", []) for r in plan["runs"]}
    blocked: dict[str, str] = {}

    def gate_of(name: str, seen: frozenset = frozenset()) -> str:
        if name in failed:
            return name
        for dep in after.get(name, []):
            if dep not in seen and (gate := gate_of(dep, seen | {name})):
                return gate
        return ""

    for run in plan["runs"]:
        if run["name"] not in failed and (gate := gate_of(run["name"])):
            blocked[run["name"]] = gate
    return blocked


PAST_GATE = "†"
PAST_GATE_NOTE = (
    f"{PAST_GATE} Run past its task's failed gate (`bench.paper.run --past_failed_gates`): the "
    "gated models did not learn the task at this scale, so no ordering is read from these cells.\n"
)


def _cell(records: dict, name: str, blocked: dict | None = None) -> str:
    """A sweep's cell: mean ± spread at the best rate, and its best run; ``PAST_GATE`` marks
    a run made past a failed gate (``blocked``: ``waiting``'s map)."""
    if name not in records:
        return f"not run: {blocked[name]} failed" if name in (blocked or {}) else "missing"
    s = sweep_summary(records[name]["results"]["sweep"])
    cell = _spread(s["mean"], s["std"], s["seeds"], s["best"], f", lr {s['learning_rate']:g}")
    return cell + (f" {PAST_GATE}" if name in (blocked or {}) else "")


def _spread(mean: float, std: float, n: int, best: float, detail: str = "") -> str:
    """The report's cell for scores over seeds: ``mean ± std (n=N<detail>; best B)``."""
    return f"{mean:.1f} ± {std:.1f} (n={n}{detail}; best {best:.1f})"


def _past_gate_note(table: str) -> str:
    return f"\n{PAST_GATE_NOTE}" if f" {PAST_GATE} |" in table else ""


def _provenance(records: list[dict], command: str) -> str:
    if not records:
        return "_no finished run yet_\n"
    dates = sorted(r["date"] for r in records)
    machines = sorted({r["machine"] for r in records})
    commits = sorted({r["commit"] for r in records})
    # The runner's command line of each record (a run finished by a later invocation, e.g. with
    # --only, says so), in the order first met; the plan's for records that lack one.
    commands = list(dict.fromkeys(r.get("runner_command") or command for r in records))
    return (
        f"_Machine: {'; '.join(machines)}. Dates: {dates[0]} to {dates[-1]}. Commit: "
        f"{', '.join(commits)}. Command: {'; '.join(f'`{c}`' for c in commands)}._\n"
    )


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def table5(records: dict, blocked: dict | None = None) -> tuple[str, list[dict]]:
    rows, used = [], []
    for label, kind, model in TABLE5_ROWS:
        names = [f"{kind}/{model}/{t}" for t in TASK_COLUMNS]
        used += [records[n] for n in names if n in records]
        paper = PAPER_TABLE5.get("bilstm" if kind == "bilstm" else model)
        paper_cells = [f"{p:.1f}" for p in paper] if paper else ["-", "-"]
        rows.append([label, *[_cell(records, n, blocked) for n in names], *paper_cells])
    header = [
        "model",
        "QNLI dev acc",
        "SQuAD v1.1 dev F1",
        "WNUT-16 dev F1",
        "paper QNLI",
        "paper SQuAD F1",
    ]
    text = _table(header, rows)
    return text + _past_gate_note(text), used


def _final_eval(record: dict) -> dict:
    curve = record["results"]["eval_curve"]
    return curve[max(curve, key=int)]


def table6(records: dict, plan: dict, blocked: dict | None = None) -> tuple[str, list[dict]]:
    rows, used = [], []
    pretrains = [r for r in plan["runs"] if r["kind"] == "pretrain"]
    ladder = [
        r
        for r in pretrains
        if r["info"]["model"] == "bert" or r["info"]["model"].startswith("bert_L")
    ]
    for run in sorted(ladder, key=lambda r: (r["info"]["layers"], r["info"]["hidden"])):
        info, record = run["info"], records.get(run["name"])
        size = (info["layers"], info["hidden"], info["heads"])
        if record:
            used.append(record)
            final = _final_eval(record)
            lm = f"{100 * final['mlm_accuracy']:.1f} / {math.exp(final['mlm_loss']):.1f}"
        else:
            lm = "missing"
        names = [f"finetune/{info['model']}/{t}" for t in TASK_COLUMNS]
        used += [records[n] for n in names if n in records]
        rows.append([*map(str, size), lm, *[_cell(records, n, blocked) for n in names]])
    paper = [
        f"{n}/{h}/{a}: ppl {p:.2f}, MNLI-m {m:.1f}" for (n, h, a), (p, m) in PAPER_TABLE6.items()
    ]
    header = ["#L", "#H", "#A", "held-out MLM acc % / ppl", "QNLI", "SQuAD F1", "WNUT-16 F1"]
    text = _table(header, rows)
    return text + "\nPaper (L/H/A): " + "; ".join(paper) + ".\n" + _past_gate_note(text), used


TABLE7_MODELS = {"bert": "bert (2 x 128)", "minilm_continued": "ceiling (MiniLM continued)"}


def table7(records: dict) -> tuple[str, list[dict]]:
    """Fine-tuning against the six layer combinations, per model: each feature-based run sits
    beside the same model's own fine-tuning (``bench.paper.plan``: it reads that record)."""
    used, rows = [], []
    combos: dict[str, dict[str, list[dict]] | None] = {}
    for model in TABLE7_MODELS:
        for kind in ("finetune", "feature_based"):
            if f"{kind}/{model}/wnut16" in records:
                used.append(records[f"{kind}/{model}/wnut16"])
        feature = records.get(f"feature_based/{model}/wnut16")
        # bertjax.finetune.feature_based's rows, one per head: {"combination", "seed", "dev"}
        rows_of = feature["results"]["feature_based"].get("rows", []) if feature else None
        if rows_of is not None:
            combos[model] = {}
            for r in rows_of:
                combos[model].setdefault(str(r.get("combination")), []).append(r)
    tuned = [_cell(records, f"finetune/{m}/wnut16") for m in TABLE7_MODELS]
    rows.append(["fine-tuning (all layers)", *tuned, f"{PAPER_TABLE7['fine-tuning']:.1f}"])
    for combination in list(PAPER_TABLE7)[1:]:
        cells = []
        for model in TABLE7_MODELS:
            heads = (combos.get(model) or {}).get(combination)
            scores = [h["dev"]["f1"] for h in heads or [] if "f1" in h.get("dev", {})]
            if not heads:
                cells.append("missing")
            elif len(scores) < len(heads):
                cells.append("no dev F1")
            else:
                mean = sum(scores) / len(scores)
                cells.append(_spread(mean, sample_std(scores), len(scores), max(scores)))
        rows.append([f"feature-based: {combination}", *cells, f"{PAPER_TABLE7[combination]:.1f}"])
    header = [
        "approach (WNUT-16 NER, dev F1)",
        *TABLE7_MODELS.values(),
        "paper (CoNLL-2003 dev F1)",
    ]
    return _table(header, rows), used


def gates(records: dict, plan: dict, failed: dict | None = None) -> tuple[str, list[dict]]:
    """The protocol check per task (``bench.paper.steps.gate``): baseline, the gated models'
    best runs, passed, failed (``failed``: the verdicts of gates that failed, by name:
    ``plan.failed_gate_path``) or not run yet."""
    rows, used = [], []
    for run in (r for r in plan["runs"] if r["kind"] == "gate"):
        record = records.get(run["name"])
        verdict = "passed"
        if record is None:
            record, verdict = (failed or {}).get(run["name"]), "failed"
        if record is None:
            rows.append([run["info"]["task"], "-", "not run yet"])
            continue
        used.append(record)
        result = record["results"]
        best = ", ".join(f"{m} {v:.1f}" for m, v in result["best"].items())
        if verdict == "failed":
            verdict = f"failed (each must reach {result['baseline'] + result['margin']:.1f})"
        rows.append([run["info"]["task"], f"{result['baseline']:.1f}", f"{verdict}: {best}"])
    return _table(["task", "trivial baseline", "gated models' best dev score"], rows), used


def curves(records: dict, plan: dict, blocked: dict | None = None) -> tuple[str, list[dict], dict]:
    """(markdown, records used, {series: [(step, value)]}) for the two curves; a downstream
    series with a run past a failed gate (``blocked``) is marked ``PAST_GATE``."""
    used, series = [], {}
    past_gate = {  # (task, base model) of the curves with a run made past a failed gate
        (r["info"].get("task"), r["info"].get("model", "").split("@")[0])
        for r in plan["runs"]
        if r["kind"] == "finetune" and r["name"] in (blocked or {}) and r["name"] in records
    }
    for run in plan["runs"]:
        record = records.get(run["name"])
        if run["kind"] != "pretrain" or record is None or run["info"]["model"] == "no_pretraining":
            continue
        used.append(record)
        # An LTR run's "mlm_accuracy" is its next-token accuracy at every position.
        curve, objective = record["results"]["eval_curve"], run["info"]["objective"].upper()
        points = [(int(s), 100 * v["mlm_accuracy"]) for s, v in curve.items()]
        series[f"held-out {objective} acc: {run['info']['model']}"] = points
    tasks = sorted(
        {
            r["info"]["task"]
            for r in plan["runs"]
            if r["kind"] == "finetune" and "@" in r["info"]["model"]
        }
    )
    for run in plan["runs"]:
        model = run["info"].get("model", "")
        if run["kind"] != "finetune" or run["info"].get("task") not in tasks:
            continue
        base = model.split("@")[0]
        if base not in ("bert", "ltr"):
            continue
        record = records.get(run["name"])
        key = f"{run['info']['task']} dev: {base}"
        if (run["info"]["task"], base) in past_gate:
            key += f" {PAST_GATE}"
        series.setdefault(key, [])
        if record:
            used.append(record)
            series[key].append(
                (run["info"]["step"], sweep_summary(record["results"]["sweep"])["mean"])
            )
    steps = sorted({s for points in series.values() for s, _ in points})
    rows = []
    for name, points in series.items():
        values = dict(points)
        rows.append([name, *(f"{values[s]:.1f}" if s in values else "" for s in steps)])
    header = ["series \\ pretraining step", *map(str, steps)]
    text = _table(header, rows)
    return text + _past_gate_note(text), used, series


def plot(series: dict, path: str) -> bool:
    """The curves as a PNG; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    # One panel for the held-out curves, one per downstream task ("<task> dev: <model>"): a
    # task's accuracy and another's F1 do not share an axis.
    panels = {"held-out": "held-out accuracy (%)"}
    for name in series:
        if not name.startswith("held-out"):
            task = name.split(" dev: ")[0]
            panels.setdefault(task, f"{task} dev score (%)")
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    axis_of = dict(zip(panels, axes[0], strict=True))
    for name, points in series.items():
        axis = axis_of["held-out" if name.startswith("held-out") else name.split(" dev: ")[0]]
        if points:
            axis.plot(*zip(*sorted(points), strict=True), marker="o", label=name)
    for key, title in panels.items():
        axis_of[key].set_xlabel("pretraining step")
        axis_of[key].set_title(title)
        if axis_of[key].get_legend_handles_labels()[0]:
            axis_of[key].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def render(out_dir: str, png_path: str = "", reading: str = "") -> str:
    """The report; ``reading``: Markdown a person wrote after reading the tables (what reproduces
    and what does not, and why), placed under the title as it is."""
    plan, records = load(out_dir)
    failed = failed_gates(out_dir)
    blocked = waiting(plan, failed)
    command = plan["command"]
    parts = [f"# The paper in miniature: scale `{plan['scale']}`\n"]
    if plan["scale"] != "full":
        parts.append(
            f"**Scale `{plan['scale']}` checks the plumbing: tiny models, few steps and "
            "examples. These numbers are not findings.**\n"
        )
    if reading:
        parts.append(reading.strip() + "\n")
    for title, (text, used) in (
        (
            "The protocol check: is each task learnt at this scale?",
            gates(records, plan, failed),
        ),
        ("Table 5: pretraining tasks", table5(records, blocked)),
        ("Table 6: model size", table6(records, plan, blocked)),
        ("Table 7: feature-based NER", table7(records)),
    ):
        parts += [f"## {title}\n", text, _provenance(used, command)]
    text, used, series = curves(records, plan, blocked)
    parts += ["## Curves: accuracy against pretraining steps\n", text]
    if png_path and plot(series, png_path):
        parts.append(f"![curves]({os.path.basename(png_path)})\n")
    parts.append(_provenance(used, command))
    missing = [r["name"] for r in plan["runs"] if r["name"] not in records]
    parts.append("## Missing runs\n")
    lines = []
    for name in missing:
        why = ""
        if name in failed:
            why = " (failed: the protocol check above)"
        elif name in blocked:
            why = f" (not run: it waits for `{blocked[name]}`, which failed)"
        lines.append(f"- `{name}`{why}")
    parts.append("\n".join(lines) + "\n" if missing else "None.\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.paper.report", description=__doc__)
    parser.add_argument("--out_dir", default="")
    parser.add_argument(
        "--output", default="", help="write here (and <output>_curves.png beside it)"
    )
    parser.add_argument(
        "--reading", default="", help="a Markdown file with the reading, placed under the title"
    )
    args = parser.parse_args(argv)
    try:
        reading = ""
        if args.reading:
            try:
                with open(args.reading, encoding="utf-8") as f:
                    reading = f.read()
            except OSError as e:
                raise ValueError(f"--reading={args.reading}: {e.strerror or e}") from None
        png = ""
        if args.output:  # docs/paper_miniature.md -> docs/paper_miniature_curves.png
            os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
            png = os.path.splitext(os.path.abspath(args.output))[0] + "_curves.png"
        text = render(args.out_dir, png, reading)
        if args.output:
            atomic.write_text(args.output, text)
    except ValueError as e:
        print(f"bench.paper.report: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"bench.paper.report: --output={args.output}: {e.strerror or e}", file=sys.stderr)
        return 2
    if not args.output:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
