"""bench/paper's runner and report without running bertjax: the plan holds the paper's runs with
the overrides that make them comparable, in an order that reads nothing before it is written;
the runner skips finished runs, resumes the rest, skips the dependents of a failure and the item-1
runs; the in-process steps copy what they say; the report computes mean and spread over seeds
from fixture results and names the missing runs; bad flags are one line."""

import functools
import json
import os
import pathlib
import re
import shutil
import threading
import time

import pytest

from bench.paper import outcomes, plan, report, run, scales, steps

SMOKE = scales.SCALES["smoke"]
FULL = scales.SCALES["full"]


def _plan(scale=SMOKE, minilm="/m"):
    return plan.build("/data", "/out", scale, minilm)


def _overrides(r: plan.Run) -> dict:
    return dict(a[len("--config.") :].split("=", 1) for a in r.argv if a.startswith("--config."))


def test_the_plan_holds_every_experiment_in_an_order_that_reads_only_finished_runs():
    runs = _plan()
    names = [r.name for r in runs]
    assert len(names) == len(set(names))
    for i, r in enumerate(runs):
        for dep in r.after:
            assert names.index(dep) < i, (r.name, dep)
    pretrains = {r.get("model") for r in runs if r.kind == "pretrain"}
    assert pretrains == {
        "bert",
        "no_nsp",
        "ltr",
        "no_pretraining",
        "minilm_continued",
        "bert_L1_H32",
        "bert_L2_H96",
    }
    for model in pretrains:
        assert {f"finetune/{model}/{t}" for t in ("qnli", "squad", "wnut16")} <= set(names)
    for model in plan.CURVE_MODELS:
        for step in SMOKE.curve_steps:
            assert f"snapshot/{model}@{step}" in names
            assert f"finetune/{model}@{step}/qnli" in names
    # Every fine-tuning on a task but the gated models' waits for the task's gate, which reads
    # those; and the gated models' pretraining comes before every other pretraining.
    by_name = {r.name: r for r in runs}
    for r in runs:
        if r.kind in ("finetune", "bilstm", "feature_based") and r.get("model") not in (
            plan.GATED_MODELS
        ):
            assert f"gate/{r.get('task')}" in r.after, r.name
    assert by_name["gate/squad"].after == ("finetune/bert/squad", "finetune/minilm_continued/squad")
    pretrain_order = [r.get("model") for r in runs if r.kind == "pretrain"]
    assert pretrain_order[:2] == ["bert", "minilm_continued"]
    assert names.index("gate/wnut16") < names.index("pretrain/no_nsp")
    assert {r.name: r.needs_key for r in runs if r.needs_key} == {
        "bilstm/ltr/squad": "model.head_rnn",
        "bilstm/ltr/qnli": "model.head_rnn",
        "bilstm/ltr/wnut16": "model.head_rnn",
        "feature_based/bert/wnut16": "feature_based.restarts",
        "feature_based/minilm_continued/wnut16": "feature_based.restarts",
    }
    # Table 7 compares each model's features with its own fine-tuning: it reads that, not the gate.
    for model in ("bert", "minilm_continued"):
        after = by_name[f"feature_based/{model}/wnut16"].after
        assert f"finetune/{model}/wnut16" in after and "gate/wnut16" not in after, after


def test_the_pretraining_variants_differ_only_where_the_paper_varies_them():
    by = {r.get("model"): r for r in _plan(FULL) if r.kind == "pretrain"}
    bert, no_nsp, ltr = (_overrides(by[m]) for m in ("bert", "no_nsp", "ltr"))
    assert by["bert"].argv[3] == "--config=configs/bert_base.py"
    assert by["no_nsp"].argv[3] == "--config=configs/no_nsp.py"
    assert by["ltr"].argv[3] == "--config=configs/left_to_right.py"
    assert no_nsp == bert
    assert {k: v for k, v in ltr.items() if bert[k] != v} == {
        "data.max_predictions_per_seq": str(FULL.max_seq_length)
    }
    assert bert["train.num_steps"] == str(FULL.pretrain_steps) and bert["seed"] == "0"
    assert bert["model.vocab_size"] == plan.VOCAB_SIZE  # the learnt vocab's, filled in at start
    # every curve step is kept for good, whatever preemption saves come between
    every, keep_every = int(bert["checkpoint.every_steps"]), int(bert["checkpoint.keep_every"])
    assert all(s % keep_every == 0 and s % every == 0 for s in FULL.curve_steps)
    floor = _overrides(by["no_pretraining"])
    assert floor["optimizer.learning_rate"] == "0.0" and floor["train.num_steps"] == "1"
    ladder = {
        (o["model.num_layers"], o["model.hidden_size"])
        for o in map(_overrides, by.values())
        if "model.num_layers" in o
    }
    assert len(ladder) >= 3
    assert _overrides(by["minilm_continued"])["init_checkpoint"] == "/m"
    assert plan.build("/d", "/o", SMOKE, "")[4:][-1].kind  # builds without MiniLM
    assert [r for r in plan.build("/d", "/o", SMOKE, "") if r.unavailable] == [
        r for r in plan.build("/d", "/o", SMOKE, "") if r.name == "pretrain/minilm_continued"
    ]


def test_finetuning_runs_are_the_papers_sweep_from_the_right_checkpoint():
    runs = {r.name: r for r in _plan(FULL)}
    o = _overrides(runs["finetune/bert/qnli"])
    assert o["mode"] == "sweep" and o["task.name"] == "qnli" and o["data.pack_sequences"] == "True"
    assert o["init_checkpoint"] == "/out/pretrain/bert"
    assert o["sweep.learning_rates"] == "(" + ",".join(f"{x:g}" for x in FULL.learning_rates) + ",)"
    assert o["sweep.num_restarts"] == str(FULL.restarts)
    assert o["task.data_dir"] == "/out/tasks/qnli"
    squad = _overrides(runs["finetune/bert/squad"])
    assert runs["finetune/bert/squad"].argv[3] == "--config=configs/finetune_squad.py"
    assert squad["task.name"] == "squad_v1" and squad["data.pack_sequences"] == "False"
    assert int(squad["task.doc_stride"]) + int(squad["task.max_query_length"]) + 3 < int(
        squad["data.max_seq_length"]
    )
    ceiling = _overrides(runs["finetune/minilm_continued/wnut16"])
    assert ceiling["sweep.num_restarts"] == str(FULL.ceiling_restarts)
    assert ceiling["sweep.learning_rates"] == (
        "(" + ",".join(f"{x:g}" for x in FULL.ceiling_learning_rates) + ",)"
    )
    step = FULL.curve_steps[0]
    curve = _overrides(runs[f"finetune/ltr@{step}/qnli"])
    assert curve["init_checkpoint"] == f"/out/snapshots/ltr_at_{step}"
    assert _overrides(runs["bilstm/ltr/qnli"])["model.head_rnn"] == "bilstm"
    feature = _overrides(runs["feature_based/bert/wnut16"])
    assert feature["mode"] == "feature_based" and feature["init_checkpoint"] == "/out/pretrain/bert"
    ceiling = _overrides(runs["feature_based/minilm_continued/wnut16"])
    assert ceiling["feature_based.rnn_size"] == "384" and feature["feature_based.rnn_size"] == "128"
    # Each combination's heads have as many seeds as the model's own fine-tuning: Table 7's spread.
    assert feature["feature_based.restarts"] == str(FULL.restarts) == feature["sweep.num_restarts"]
    assert ceiling["feature_based.restarts"] == str(FULL.ceiling_restarts)
    # The token task: about as many updates as the sentence-pair task (bench/paper/README.md).
    assert _overrides(runs["finetune/bert/wnut16"])["train.num_epochs"] == "9.0"
    assert feature["train.num_epochs"] == "9.0"
    assert _overrides(runs["finetune/bert/qnli"])["train.num_epochs"] == str(FULL.finetune_epochs)


def test_only_selects_runs_with_everything_they_read():
    names = [r.name for r in plan.select(_plan(), "finetune/ltr@")]
    assert names == [
        "vocab/corpus",
        "subset/qnli",
        "pretrain/bert",
        "pretrain/minilm_continued",
        "finetune/bert/qnli",
        "finetune/minilm_continued/qnli",
        "gate/qnli",
        "pretrain/ltr",
        "snapshot/ltr@10",
        "finetune/ltr@10/qnli",
    ]
    with pytest.raises(ValueError, match="'nope' matches no run"):
        plan.select(_plan(), "nope")


def test_resolve_fills_in_the_learnt_vocab_size(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\na\n\n")
    assert plan.resolve(("x", "--config.model.vocab_size={vocab_size}"), str(vocab)) == [
        "x",
        "--config.model.vocab_size=3",
    ]


def _fake_plan():
    # One kind whose output no later run reads (only its record): ordering, not reruns.
    mk = lambda name, after=(), key="": plan.Run(name, "finetune", ("true",), "/w", after, key)  # noqa: E731
    return [
        mk("vocab/a"),
        mk("pretrain/b", ("vocab/a",)),
        mk("finetune/c", ("pretrain/b",)),
        mk("finetune/d", ("vocab/a",)),
        mk("bilstm/e", ("vocab/a",), "model.head_rnn"),
    ]


def test_the_runner_skips_finished_runs_resumes_the_rest_and_isolates_failures(tmp_path, capsys):
    calls = []

    def execute(r, out_dir):
        calls.append(r.name)
        return (3, {"log": "L"}) if r.name in failing else (0, {"ok": r.name})

    out, failing = str(tmp_path), {"pretrain/b"}
    failed = run.run_plan(_fake_plan(), out, "smoke", ["x"], lambda k: False, execute)
    assert failed == ["pretrain/b"]
    assert calls == ["vocab/a", "pretrain/b", "finetune/d"]  # c waits for b; e needs item 1
    text = capsys.readouterr().out
    assert "skipped  finetune/c: waits for pretrain/b" in text
    assert "skipped  bilstm/e: needs config key model.head_rnn" in text
    record = json.load(open(plan.results_path(out, "vocab/a")))
    assert record["results"] == {"ok": "vocab/a"} and record["scale"] == "smoke"
    assert {"commit", "machine", "date", "argv"} <= set(record)
    calls.clear()
    failing = set()
    assert run.run_plan(_fake_plan(), out, "smoke", ["x"], lambda k: True, execute) == []
    assert calls == ["pretrain/b", "finetune/c", "bilstm/e"]  # finished ones are not rerun
    calls.clear()
    os.remove(plan.results_path(out, "finetune/c"))
    run.run_plan(_fake_plan(), out, "smoke", ["x"], lambda k: True, execute)
    assert calls == ["finetune/c"]


def test_a_new_machine_reruns_only_what_a_pending_run_reads_and_holds_it_to_its_record(
    tmp_path, capsys
):
    """``--record_dir`` outlives ``OUT``: on a machine with an empty ``OUT``, the vocab comes back
    from the record folder's copy, a lost output that a pending run reads is made again and
    compared with its record, and what no pending run reads is left alone."""
    out, records = tmp_path / "out", tmp_path / "record"
    mk = lambda name, kind, after=(): plan.Run(name, kind, ("true",), str(out / name), after)  # noqa: E731
    runs = [
        mk("vocab/a", "vocab"),
        mk("subset/b", "subset"),
        mk("subset/c", "subset"),
        mk("finetune/d", "finetune", ("vocab/a", "subset/b")),
        mk("finetune/e", "finetune", ("vocab/a", "subset/c")),
    ]
    calls, counts, failing = [], {"subset/b": 3, "subset/c": 5}, {"finetune/d"}

    def execute(r, out_dir):
        calls.append(r.name)
        if r.kind == "vocab":
            out.mkdir(exist_ok=True)
            (out / "vocab.txt").write_text("[PAD]\nword\n")
            return 0, {"entries": 2, "sha256": outcomes.sha256(str(out / "vocab.txt"))}
        if r.kind == "subset":
            os.makedirs(r.workdir)  # fails if a differing rerun's output were left in place
            return 0, {"examples": {"train.tsv": counts[r.name]}}
        return (1, {"log": "L"}) if r.name in failing else (0, {"sweep": {}})

    assert run.run_plan(runs, str(out), "s", ["x"], execute=execute, record_dir=str(records))
    assert calls == ["vocab/a", "subset/b", "subset/c", "finetune/d", "finetune/e"]
    assert sorted(os.listdir(records / "results")) == [
        "finetune__e.json", "subset__b.json", "subset__c.json", "vocab__a.json",
    ]  # fmt: skip
    assert (records / "vocab.txt").read_text() == "[PAD]\nword\n"  # kept beside its record
    shutil.rmtree(out)  # a new machine: only the records are left
    calls.clear(), failing.clear(), capsys.readouterr()
    assert run.run_plan(runs, str(out), "s", ["x"], execute=execute, record_dir=str(records)) == []
    assert calls == ["subset/b", "finetune/d"]  # subset/c: only finetune/e read it, and it is done
    printed = capsys.readouterr().out
    assert f"restored vocab/a: {records}/vocab.txt, its sha256 recorded" in printed
    assert "rerun    subset/b: equal to its record in " in printed
    assert (out / "vocab.txt").read_text() == "[PAD]\nword\n"
    # A rerun that does not reproduce its record fails, and what reads it waits.
    os.remove(plan.results_path(str(records), "finetune/d"))
    shutil.rmtree(out / "subset/b")
    (records / "vocab.txt").write_text("[PAD]\nother\n")  # a bad copy is not restored
    calls.clear(), capsys.readouterr()
    counts["subset/b"] = 4
    failed = run.run_plan(runs, str(out), "s", ["x"], execute=execute, record_dir=str(records))
    assert failed == ["subset/b"] and calls == ["subset/b"]  # the vocab in OUT still matches
    printed = capsys.readouterr().out
    assert re.search(
        r"^FAILED   subset/b: rerun differs from its record: examples train.tsv: recorded 3, "
        rf"now 4 \(its output moved to {re.escape(str(out))}/subset/b.differs-\d{{8}}T\d{{6}}\)$",
        printed,
        re.M,
    ), printed
    assert "skipped  finetune/d: waits for subset/b" in printed
    record = json.loads(open(plan.results_path(str(records), "subset/b")).read())
    assert record["results"]["examples"] == {"train.tsv": 3}  # the record is left as it was
    os.remove(out / "vocab.txt")
    calls.clear()
    counts["subset/b"] = 3
    assert run.run_plan(runs, str(out), "s", ["x"], execute=execute, record_dir=str(records)) == []
    assert calls == ["vocab/a", "subset/b", "finetune/d"]  # the kept copy no longer matched


def test_jobs_run_independent_runs_at_once_and_each_after_what_it_reads(tmp_path):
    """``--jobs=2``: a run starts once every run it reads has finished, two at a time; with one
    job the plan's order, one after another."""
    mk = lambda name, after=(): plan.Run(name, "finetune", ("true",), "/w", after)  # noqa: E731
    runs = [mk("a"), mk("b", ("a",)), mk("c"), mk("d", ("b", "c")), mk("e", ("missing",))]
    for jobs in (1, 2):
        spans, lock = {}, threading.Lock()

        def execute(r, out_dir, spans=spans, lock=lock):
            start = time.monotonic()
            time.sleep(0.3)
            with lock:
                spans[r.name] = (start, time.monotonic())
            return 0, {}

        out = str(tmp_path / str(jobs))
        assert run.run_plan(runs, out, "s", ["x"], execute=execute, jobs=jobs) == []
        begin = {n: s for n, (s, _) in spans.items()}
        end = {n: e for n, (_, e) in spans.items()}
        assert begin["b"] >= end["a"] and begin["d"] >= max(end["b"], end["c"])
        if jobs == 1:
            assert sorted(begin, key=begin.get) == ["a", "b", "c", "d", "e"]
            assert all(begin[y] >= end[x] for x, y in zip("abcd", "bcde", strict=True))
        else:
            assert begin["c"] < end["a"]  # side by side with a; e (it reads no run) next


def test_a_pretraining_rerun_on_another_cpu_is_held_to_tolerances_and_kept_in_its_record(
    tmp_path, capsys
):
    """Another CPU sums floats in another order: a pretraining rerun there need only stay within
    ``outcomes``' tolerances of its record (and is added to its ``reruns``); on the record's own
    machine it must be bit-identical; beyond them it fails."""
    out, records = tmp_path / "out", tmp_path / "record"
    pre = plan.Run("pretrain/b", "pretrain", ("true",), str(out / "b"))
    reader = plan.Run("finetune/c", "finetune", ("true",), str(out / "c"), ("pretrain/b",))
    curve = {"500": {"mlm_accuracy": 0.1, "mlm_loss": 6.5}}
    rerun_curve = {"500": {"mlm_accuracy": 0.105, "mlm_loss": 6.55}}
    path = plan.results_path(str(records), "pretrain/b")
    os.makedirs(os.path.dirname(path))

    def record(machine):
        with open(path, "w") as f:
            json.dump({"machine": machine, "results": {"eval_curve": curve}}, f)

    execute = lambda r, o: (0, {"eval_curve": rerun_curve} if r is pre else {})  # noqa: E731
    for machine, failed in (("another CPU", []), (run.provenance()["machine"], ["pretrain/b"])):
        record(machine)
        assert run.run_plan([pre, reader], str(out), "s", ["x"], execute=execute,
                            record_dir=str(records)) == failed  # fmt: skip
        printed = capsys.readouterr().out
        kept = json.loads(open(path).read())
        if failed:  # the record's own machine: bit-identical or nothing
            assert "FAILED   pretrain/b: rerun differs from its record: eval_curve 500" in printed
            assert "reruns" not in kept
        else:
            assert "rerun    pretrain/b: on " in printed and "within the tolerances" in printed
            assert kept["reruns"][0]["results"]["eval_curve"] == rerun_curve
            assert kept["reruns"][0]["machine"] == run.provenance()["machine"]
            assert "finished finetune/c" in printed
            os.remove(plan.results_path(str(records), "finetune/c"))
    rerun_curve["500"]["mlm_accuracy"] = 0.13  # 3 points: beyond, even on another CPU
    record("another CPU")
    assert run.run_plan([pre, reader], str(out), "s", ["x"], execute=execute,
                        record_dir=str(records)) == ["pretrain/b"]  # fmt: skip
    assert (
        "rerun differs from its record: eval_curve 500 mlm_accuracy: recorded 0.1, now 0.13 "
        "(limit 0.02), on another machine" in capsys.readouterr().out
    )


def test_tolerances_hold_accuracies_to_2_points_nsp_to_its_noise_and_the_rest_to_2_percent():
    old = {"eval_curve": {"500": {"mlm_accuracy": 0.10, "mlm_loss": 6.0}}}
    near = {"eval_curve": {"500": {"mlm_accuracy": 0.119, "mlm_loss": 6.1}}}
    assert outcomes.beyond_tolerance("pretrain", old, near) == ""
    far = {"eval_curve": {"500": {"mlm_accuracy": 0.10, "mlm_loss": 6.2}}}
    assert outcomes.beyond_tolerance("pretrain", old, far) == (
        "eval_curve 500 mlm_loss: recorded 6.0, now 6.2 (limit 0.12)"
    )
    nsp = {"eval_curve": {"500": {"nsp_accuracy": 0.70, "sequences": 256.0}}}
    moved = {"eval_curve": {"500": {"nsp_accuracy": 0.64, "sequences": 256.0}}}
    assert outcomes.beyond_tolerance("pretrain", nsp, moved) == ""  # 3 SE: 8.6 points
    moved["eval_curve"]["500"]["nsp_accuracy"] = 0.60
    assert outcomes.beyond_tolerance("pretrain", nsp, moved).startswith(
        "eval_curve 500 nsp_accuracy: recorded 0.7, now 0.6 (limit 0.0859"
    )
    fewer = {"eval_curve": {}}
    assert outcomes.beyond_tolerance("pretrain", old, fewer).startswith("eval_curve steps:")
    assert outcomes.beyond_tolerance("subset", {"examples": 1}, {"examples": 2}) != ""
    # The verdict: bit-identity on the record's machine, the tolerances on another.
    record = {"machine": "epyc", "results": old}
    assert outcomes.verdict("pretrain", record, old, "xeon") == ("equal", "")
    assert outcomes.verdict("pretrain", record, near, "epyc")[0] == "differs"
    assert outcomes.verdict("pretrain", record, near, "xeon") == (
        "tolerated", "eval_curve 500: recorded {'mlm_accuracy': 0.1, 'mlm_loss': 6.0}, now "
        "{'mlm_accuracy': 0.119, 'mlm_loss': 6.1}")  # fmt: skip
    assert outcomes.verdict("pretrain", record, far, "xeon") == (
        "differs", "eval_curve 500 mlm_loss: recorded 6.0, now 6.2 (limit 0.12), on another "
        "machine")  # fmt: skip


def test_outcomes_differs_names_the_first_difference():
    curve = {"500": {"mlm_accuracy": 0.1}, "1000": {"mlm_accuracy": 0.2}}
    assert outcomes.differs("pretrain", {"eval_curve": curve}, {"eval_curve": dict(curve)}) == ""
    changed = {**curve, "1000": {"mlm_accuracy": 0.25}}
    assert (
        outcomes.differs("pretrain", {"eval_curve": curve}, {"eval_curve": changed})
        == "eval_curve 1000: recorded {'mlm_accuracy': 0.2}, now {'mlm_accuracy': 0.25}"
    )
    assert outcomes.differs("vocab", {"sha256": "a"}, {"sha256": "b"}) == (
        "sha256: recorded a, now b"
    )
    assert outcomes.differs("vocab", {"entries": 3}, {"entries": 3, "sha256": "b"}) == ""
    assert outcomes.differs("finetune", {"sweep": 1}, {"sweep": 2}) == ""  # never rerun


def test_subset_samples_over_the_file_and_keeps_headers_sentences_and_order(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "out" / "t"
    src.mkdir()
    (src / "train.tsv").write_text("h1\th2\n" + "".join(f"{i}\tx\n" for i in range(10)))
    (src / "dev.txt").write_text("\n\n".join(f"w{i} O\nv{i} B-person\n" for i in range(7)))
    (src / "dev_mismatched.tsv").write_text("h\n1\n2\n")  # MNLI's reader needs both dev files
    (src / "test.tsv").write_text("not copied\n")
    counts = {"train.tsv": 4, "dev_mismatched.tsv": 2, "dev.txt": 3}
    assert steps.subset(str(src), str(dst), 4, 3) == counts
    header, *rows = (dst / "train.tsv").read_text().splitlines()
    assert header == "h1\th2" and len(rows) == 4
    assert [int(r.split("\t")[0]) for r in rows] == sorted(int(r.split("\t")[0]) for r in rows)
    sentences = (dst / "dev.txt").read_text().split("\n\n")
    assert len(sentences) == 3 and all(re.fullmatch(r"w(\d) O\nv\1 B-person\n?", s)
                                       for s in sentences)  # fmt: skip
    assert sorted(os.listdir(dst)) == ["dev.txt", "dev_mismatched.tsv", "train.tsv"]
    with pytest.raises(steps.StepError, match="expected a train and a dev file"):
        steps.subset(str(tmp_path / "out"), str(tmp_path / "x"), 1, 1)


def test_a_subset_keeps_both_labels_of_a_file_whose_labels_alternate():
    """QNLI's rows alternate entailment / not_entailment: every 8th row (a stride) would keep one
    label only; the sample keeps both in about equal shares."""
    rows = [f"{i}\tq\ts\t{('entailment', 'not_entailment')[i % 2]}\n" for i in range(31000)]
    kept = steps.spread(rows, 4000)
    assert len(kept) == 4000 and kept == sorted(kept, key=lambda r: int(r.split("\t")[0]))
    share = sum(r.endswith("\tentailment\n") for r in kept) / len(kept)
    assert 0.45 < share < 0.55, share
    assert steps.spread(rows, 4000) == kept and steps.spread(rows[:10], 0) == rows[:10]


def test_subset_of_squad_keeps_its_questions_in_their_paragraphs(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "out" / "squad"
    src.mkdir()
    qa = lambda i: {"id": f"q{i}", "question": "?", "answers": [{"text": "a", "answer_start": 0}]}  # noqa: E731
    data = {
        "version": "1.1",
        "data": [
            {"title": "A", "paragraphs": [{"context": "a b", "qas": [qa(0), qa(1), qa(2)]}]},
            {"title": "B", "paragraphs": [{"context": "c", "qas": [qa(3)]}]},
            {"title": "C", "paragraphs": [{"context": "d", "qas": [qa(4), qa(5)]}]},
        ],
    }
    for name in ("train-v1.1.json", "dev-v1.1.json"):
        (src / name).write_text(json.dumps(data))
    assert steps.subset(str(src), str(dst), 2, 0) == {"train-v1.1.json": 2, "dev-v1.1.json": 6}
    kept = json.loads((dst / "train-v1.1.json").read_text())
    ids = [q["id"] for a in kept["data"] for p in a["paragraphs"] for q in p["qas"]]
    assert len(ids) == 2 and ids == sorted(ids)  # in file order
    titles = {"A": {"q0", "q1", "q2"}, "B": {"q3"}, "C": {"q4", "q5"}}
    assert [a["title"] for a in kept["data"]] == [t for t in "ABC" if titles[t] & set(ids)]
    assert json.loads((dst / "dev-v1.1.json").read_text()) == data
    (src / "train-v1.1.json").write_text('{"data": 1}')
    with pytest.raises(steps.StepError, match="train-v1.1.json: not SQuAD v1.1 JSON"):
        steps.subset(str(src), str(dst), 2, 0)


def test_the_gate_asks_each_gated_model_to_beat_the_trivial_baseline(tmp_path):
    task = tmp_path / "qnli"
    task.mkdir()
    labels = ["entailment"] * 6 + ["not_entailment"] * 4
    (task / "dev.tsv").write_text("index\tq\ts\tlabel\n" + "".join(f"{i}\tq\ts\t{y}\n"
                                  for i, y in enumerate(labels)))  # fmt: skip
    assert steps.trivial_baseline(str(task)) == 60.0
    assert steps.trivial_baseline(str(tmp_path / "wnut16")) == 0.0  # F1 of no entity
    sweep = lambda *scores: {"rows": [{"score": s} for s in scores]}  # noqa: E731
    passed = steps.gate(str(task), {"bert": sweep(55.0, 63.0), "ceiling": sweep(70.0)}, 2.0)
    assert passed == {"baseline": 60.0, "margin": 2.0, "best": {"bert": 63.0, "ceiling": 70.0}}
    with pytest.raises(steps.StepError, match=r"bert 61\.5 not 2 points above .* 60\.0"):
        steps.gate(str(task), {"bert": sweep(61.5), "ceiling": sweep(70.0)}, 2.0)


def test_a_failed_gate_makes_the_tasks_other_runs_wait(tmp_path, capsys):
    """The gate reads the sweeps' records, in the record folder (``--record_dir``)."""
    out, records = tmp_path / "out", tmp_path / "record"
    task = out / "tasks" / "qnli"
    task.mkdir(parents=True)
    (task / "dev.tsv").write_text("h\n0\ta\tb\tentailment\n1\ta\tb\tnot_entailment\n")
    for model, score in (("bert", 50.5), ("minilm_continued", 80.0)):
        record = {"results": {"sweep": {"rows": [{"score": score}]}}}
        path = plan.results_path(str(records), f"finetune/{model}/qnli")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(record, f)
    gate = next(r for r in _plan() if r.name == "gate/qnli")
    gate = plan.Run(gate.name, gate.kind, (), str(task), gate.after, info=gate.info)
    waiting = plan.Run("finetune/no_nsp/qnli", "finetune", ("true",), "/w", ("gate/qnli",))
    execute = functools.partial(run._execute, record_dir=str(records))
    failed = run.run_plan(
        [gate, waiting], str(out), "full", ["x"], execute=execute, record_dir=str(records)
    )
    assert failed == ["gate/qnli"]
    printed = capsys.readouterr().out
    assert "bert 50.5 not 2 points above the trivial baseline 50.0" in printed
    assert "skipped  finetune/no_nsp/qnli: waits for gate/qnli" in printed
    assert "not learnt" in (out / "logs" / "gate__qnli.log").read_text()
    # Its verdict is kept for the report, beside the records; a gate that passes drops it.
    failed_file = plan.failed_gate_path(str(records), "gate/qnli")
    kept = json.loads(pathlib.Path(failed_file).read_text())
    assert kept["results"] == {"baseline": 50.0, "margin": 2.0,
                               "best": {"bert": 50.5, "minilm_continued": 80.0}}  # fmt: skip
    table, _ = report.gates({}, {"runs": [{"name": "gate/qnli", "kind": "gate",
                                           "info": {"task": "qnli"}}]},
                            report.failed_gates(str(records)))  # fmt: skip
    assert "| qnli | 50.0 | failed (each must reach 52.0): bert 50.5, minilm_continued 80.0 |" in (
        table
    )
    plan_json = {"scale": "full", "command": "x", "runs": [
        {"name": "gate/qnli", "kind": "gate", "info": {"task": "qnli"}},
        {"name": "snapshot/ltr@500", "kind": "snapshot", "info": {}, "after": []},
        {"name": "finetune/no_nsp/qnli", "kind": "finetune", "after": ["gate/qnli"],
         "info": {"model": "no_nsp", "task": "qnli"}},
        {"name": "finetune/no_nsp/squad", "kind": "finetune", "after": [],
         "info": {"model": "no_nsp", "task": "squad"}},
        {"name": "later", "kind": "finetune", "after": ["snapshot/ltr@500", "finetune/no_nsp/qnli"],
         "info": {"model": "x", "task": "squad"}}]}  # fmt: skip
    view = tmp_path / "view"  # the report of a record folder that holds only this verdict
    shutil.copytree(records / "failed_gates", view / "failed_gates")
    (view / "plan.json").write_text(json.dumps(plan_json))
    text = report.render(str(view))
    assert "- `gate/qnli` (failed: the protocol check above)" in text
    # What waits for the failed gate, directly or through a run it reads, says so; nothing else.
    assert "- `finetune/no_nsp/qnli` (not run: it waits for `gate/qnli`, which failed)" in text
    assert "- `later` (not run: it waits for `gate/qnli`, which failed)" in text
    assert "- `finetune/no_nsp/squad`\n" in text and "- `snapshot/ltr@500`\n" in text
    assert "| No NSP | not run: gate/qnli failed | missing | missing |" in text
    assert report.PAST_GATE_NOTE not in text
    # --past_failed_gates: the gate fails again, what it keeps waiting runs; the report marks it.
    sweep = {"rows": [{"learning_rate": 1e-4, "seed": 0, "score": 51.0}], "primary_metric": "acc"}
    past = lambda r, o: execute(r, o) if r.kind == "gate" else (0, {"sweep": sweep})  # noqa: E731
    failed = run.run_plan([gate, waiting], str(out), "full", ["x"], execute=past,
                          record_dir=str(records), past_failed_gates=True)  # fmt: skip
    assert failed == ["gate/qnli"]
    assert "finished finetune/no_nsp/qnli in " in capsys.readouterr().out
    (view / "results").mkdir()
    shutil.copy(plan.results_path(str(records), "finetune/no_nsp/qnli"), view / "results")
    text = report.render(str(view))
    assert "| No NSP | 51.0 ± 0.0 (n=1, lr 0.0001; best 51.0) † | missing | missing |" in text
    assert report.PAST_GATE_NOTE in text and "- `finetune/no_nsp/qnli`" not in text
    os.remove(plan.results_path(str(records), "finetune/no_nsp/qnli"))
    path = plan.results_path(str(records), "finetune/bert/qnli")
    pathlib.Path(path).write_text(json.dumps({"results": {"sweep": {"rows": [{"score": 60}]}}}))
    assert run.run_plan([gate], str(out), "full", ["x"], execute=execute,
                        record_dir=str(records)) == []  # fmt: skip
    assert not os.path.exists(failed_file)
    assert os.path.exists(plan.results_path(str(records), "gate/qnli"))


def test_a_pretraining_that_lost_a_step_a_snapshot_reads_is_run_again_from_step_0(tmp_path, capsys):
    """LTR's steps 500 and 1,000 were deleted by preemption saves that counted in ``keep``: the
    snapshot fails in one line (the runner goes on), and the next start reruns the pretraining
    from step 0, its finished workdir moved aside, to a curve that must equal its record."""
    from bertjax.training import checkpoint_manifest as cm  # noqa: PLC0415

    out = tmp_path / "out"
    work = out / "pretrain" / "m"
    pretrain = plan.Run("pretrain/m", "pretrain", ("true",), str(work))
    snap = plan.Run("snapshot/m@10", "snapshot", (), str(out / "snap"), ("pretrain/m",),
                    info=(("model", "m"), ("step", 10), ("source", str(work))))  # fmt: skip
    after = plan.Run("finetune/m@10/t", "finetune", ("true",), "/w", ("snapshot/m@10",))
    curve = {"eval_curve": {"10": {"mlm_accuracy": 0.1}, "20": {"mlm_accuracy": 0.2}}}
    calls = []

    def execute(r, out_dir):
        calls.append(r.name)
        if r.kind == "pretrain":
            assert not work.exists(), "a finished workdir must be moved aside first"
            for step in (10, 20):
                (work / "checkpoints" / str(step)).mkdir(parents=True)
                (work / "checkpoints" / str(step) / "x").write_text(str(step))
                cm.write_manifest(work / "checkpoints" / str(step))
            for name in (*steps.RECORD_FILES, "vocab.txt"):
                (work / name).write_text("{}" if name.endswith(".json") else name)
            return 0, curve
        if r.kind == "snapshot":
            return run._execute(r, out_dir)
        return 0, {"sweep": {}}

    runs = [pretrain, snap, after]
    shutil.rmtree(work / "checkpoints" / "10", ignore_errors=True)
    assert run.run_plan(runs, str(out), "s", ["x"], execute=execute) == []
    shutil.rmtree(out / "snap")
    for name in ("snapshot/m@10", "finetune/m@10/t"):
        os.remove(plan.results_path(str(out), name))
    shutil.rmtree(work / "checkpoints" / "10")  # what keep did to LTR
    status, result = run._execute(snap, str(out))  # one line in its log, not a traceback
    assert status == 1
    assert "checkpoints/10: no such step (kept: 20); config.checkpoint.keep_every must" in (
        pathlib.Path(result["log"]).read_text()
    )
    calls.clear(), capsys.readouterr()
    assert run.run_plan(runs, str(out), "s", ["x"], execute=execute) == []
    assert calls == ["pretrain/m", "snapshot/m@10", "finetune/m@10/t"]
    printed = capsys.readouterr().out
    assert re.search(r"its workdir lacks steps snapshots read: moved to .*/pretrain/m"
                     r"\.lacks-steps-\d{8}T\d{6}$", printed, re.M), printed  # fmt: skip
    assert "rerun    pretrain/m: equal to its record in " in printed
    assert os.listdir(out / "snap" / "checkpoints") == ["10"]


def test_snapshot_copies_one_step_and_the_record(tmp_path):
    work = tmp_path / "w"
    for name in (*steps.RECORD_FILES, "tokenizer.json"):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(name)
    (work / "bertjax_workdir.json").write_text('{"tokenizer": "bpe"}')  # its vocab: tokenizer.json
    for step in (10, 20):
        (work / "checkpoints" / str(step) / "state").mkdir(parents=True)
        (work / "checkpoints" / str(step) / "state" / "x").write_text(str(step))
    steps.snapshot(str(work), 10, str(tmp_path / "s"))
    assert os.listdir(tmp_path / "s" / "checkpoints") == ["10"]
    assert (tmp_path / "s" / "checkpoints/10/state/x").read_text() == "10"
    assert (tmp_path / "s" / "bertjax_workdir.json").exists()
    assert (tmp_path / "s" / "tokenizer.json").read_text() == "tokenizer.json"
    with pytest.raises(steps.StepError, match="no such step \\(kept: 10, 20\\)"):
        steps.snapshot(str(work), 30, str(tmp_path / "t"))


def test_the_eval_curve_is_read_from_the_log_the_last_line_of_a_step_winning():
    log = (
        "step 10/20 loss 9\neval step 10 mlm_accuracy 0.1000 mlm_loss 7.0\n"
        "eval step 20 mlm_accuracy 0.2500 mlm_loss 6.0\n$ resumed\n"
        'eval step 20 mlm_accuracy 0.3000 mlm_loss 5.5\nfinal summary: {"step": 20}\n'
    )
    assert outcomes.eval_curve(log) == {
        "10": {"mlm_accuracy": 0.1, "mlm_loss": 7.0},
        "20": {"mlm_accuracy": 0.3, "mlm_loss": 5.5},
    }
    assert outcomes.final_summary(log) == {"step": 20}


def _sweep(scores: dict) -> dict:
    rows = [
        {"learning_rate": lr, "seed": i, "score": s}
        for lr, ss in scores.items()
        for i, s in enumerate(ss)
    ]
    return {"rows": rows, "primary_metric": "accuracy"}


def test_sweep_summary_takes_the_best_mean_rate_and_its_sample_spread():
    s = report.sweep_summary(_sweep({1e-4: [80.0, 82.0, 84.0], 3e-4: [70.0, 90.0, 71.0]}))
    assert (s["learning_rate"], s["mean"], s["std"], s["seeds"], s["best"]) == (
        1e-4,
        82.0,
        2.0,
        3,
        90.0,
    )
    one = report.sweep_summary(_sweep({5e-5: [61.5]}))
    assert (one["mean"], one["std"], one["seeds"]) == (61.5, 0.0, 1)


def _write_record(out, name, kind, info, results):
    record = {
        "name": name,
        "kind": kind,
        "info": info,
        "results": results,
        "date": "2026-11-28",
        "machine": "2-core test",
        "commit": "abc1234",
        "runner_command": "c",
    }
    path = plan.results_path(str(out), name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f)


def test_the_report_shows_mean_and_spread_from_results_and_names_missing_runs(tmp_path):
    runs = _plan()
    with open(tmp_path / "plan.json", "w") as f:
        json.dump(
            {
                "scale": "full",
                "command": "python -m bench.paper.run --scale=full",
                "runs": [{"name": r.name, "kind": r.kind, "info": dict(r.info)} for r in runs],
            },
            f,
        )
    _write_record(
        tmp_path,
        "finetune/bert/qnli",
        "finetune",
        {"model": "bert", "task": "qnli"},
        {"sweep": _sweep({1e-4: [80.0, 82.0, 84.0], 3e-4: [70.0, 90.0, 71.0]})},
    )
    curve = {
        "10": {"mlm_accuracy": 0.1, "mlm_loss": 2.0},
        "20": {"mlm_accuracy": 0.25, "mlm_loss": 1.0},
    }
    _write_record(
        tmp_path, "pretrain/bert", "pretrain", dict(_plan()[4].info), {"eval_curve": curve}
    )
    heads = [
        {"combination": c, "seed": seed, "dev": {"f1": f1}}
        for c, f1s in (("last", (40.0, 44.0)), ("all_sum", (50.0, 50.0)))
        for seed, f1 in enumerate(f1s)
    ]  # feature-based rows: one per head, two seeds per combination
    _write_record(
        tmp_path, "feature_based/bert/wnut16", "feature_based", {"model": "bert", "task": "wnut16"},
        {"feature_based": {"rows": heads}},
    )  # fmt: skip
    text = report.render(str(tmp_path))
    table7 = text.split("## Table 7")[1].split("##")[0]
    assert "| feature-based: last | 42.0 ± 2.8 (n=2; best 44.0) | missing | 94.9 |" in table7
    assert "| feature-based: all_sum | 50.0 ± 0.0 (n=2; best 50.0) | missing | 95.5 |" in table7
    assert "| feature-based: embeddings | missing | missing | 91.0 |" in table7
    table5 = text.split("## Table 5")[1].split("##")[0]
    bert_row = next(line for line in table5.splitlines() if line.startswith("| BERT"))
    assert bert_row.split(" | ")[1:4] == [
        "82.0 ± 2.0 (n=3, lr 0.0001; best 90.0)",
        "missing",
        "missing",
    ]
    table6 = text.split("## Table 6")[1].split("##")[0]
    assert "| 2 | 64 | 2 | 25.0 / 2.7 |" in table6  # final step's accuracy, exp(1.0) = 2.7
    assert "2-core test" in table5 and "abc1234" in table5
    assert "Command: `c`._" in table5  # the records' runner command, not the plan's latest
    missing = text.split("## Missing runs")[1]
    assert "`finetune/bert/squad`" in missing and "`finetune/bert/qnli`" not in missing
    assert "not findings" not in text
    curves = text.split("## Curves")[1].split("##")[0]
    assert "| held-out MLM acc: bert | 10.0 | 25.0 |" in curves


def test_bad_flags_are_one_line(tmp_path, capsys):
    assert run.main(["--data_dir", str(tmp_path), "--out_dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"--data_dir={tmp_path}: no corpus/eval.txt.gz" in err
    assert run.main(["--data_dir", str(tmp_path), "--out_dir", "o", "--scale", "huge"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "bench.paper.run: --scale=huge: expected one of smoke, full"
    assert run.main(["--data_dir", str(tmp_path), "--out_dir", "o", "--jobs", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "bench.paper.run: --jobs=0: expected 1 or more runs at once"
    data = tmp_path / "data"  # a complete data folder, and a record folder under a file
    for name in (*run.REQUIRED_DATA, *(f"corpus/{f}" for f in scales.SCALES["smoke"].corpus_files)):
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).touch()
    (tmp_path / "file").write_text("")
    flags = ["--data_dir", str(data), "--out_dir", str(tmp_path / "o")]
    assert run.main([*flags, "--record_dir", str(tmp_path / "file" / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"bench.paper.run: --record_dir={tmp_path}/file/r: Not a directory", err
    assert report.main(["--out_dir", str(tmp_path)]) == 2
    assert "no plan.json" in capsys.readouterr().err


def test_only_runs_a_part_and_the_record_keeps_the_whole_plan(tmp_path, monkeypatch):
    """The report lists every run of the plan, made or missing, whatever ``--only`` ran."""
    data = tmp_path / "data"
    for name in (*run.REQUIRED_DATA, *(f"corpus/{f}" for f in scales.SCALES["smoke"].corpus_files)):
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).touch()
    ran = []
    monkeypatch.setattr(run, "run_plan", lambda runs, *_, **__: ran.extend(runs) or [])
    out = tmp_path / "o"
    flags = ["--data_dir", str(data), "--out_dir", str(out), "--scale", "smoke"]
    assert run.main([*flags, "--only=subset/qnli"]) == 0
    assert [r.name for r in ran] == ["subset/qnli"]
    written = json.loads((out / "plan.json").read_text())["runs"]
    whole = plan.build(str(data), str(out), scales.SCALES["smoke"], run.minilm_dir())
    assert [r["name"] for r in written] == [r.name for r in whole]
