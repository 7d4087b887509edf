"""The paper miniature at test size (issue #38 item 5): ``bench.paper``'s plan, runner and report
driving the real bertjax commands end to end, on tiny models, asserting the plumbing and not the
findings.

One slice of the plan runs, with every run it reads: the learnt WordPiece vocab, the task
subsets, BERT and LTR pretrained on a corpus shard, BERT fine-tuned on QNLI, SQuAD v1.1 and
WNUT-16 (the gates read them), LTR's snapshot at a curve step fine-tuned on QNLI, LTR with a
BiLSTM head on WNUT-16 (Table 5) and Table 7's heads on BERT's frozen activations. The
commands run in this process (``bench.paper.run.launch`` swapped for
``tests.commands.in_process``), so the run costs compiles and steps, not start-ups.

The data is the layout ``python -m bench.paper.data`` writes, from the suite's own real text:
the bundled corpus's chapters as the corpus shard and the held-out file, the SQuAD fixture as
the SQuAD task and, through bench.paper's own builder (``tasks.qnli_pairs``), as QNLI, and the
CoNLL-2003 fixture's human tags named as WNUT-16's types. A test-sized model learns nothing
worth gating, so BERT alone is gated (MiniLM continued, the ceiling, is not run) and at any
score, to let the gated runs go on; the gate itself is tested in paper_run_test.py.
"""

import dataclasses
import gzip
import json
import os
import pathlib
import re
import shutil

from bench.paper import plan, report, run, scales, tasks
from bertjax.data import bundled
from tests.commands import in_process

TESTDATA = pathlib.Path(__file__).parents[1] / "testdata" / "finetune"

# The smoke scale made smaller: 1-layer models, 4 pretraining steps, 16 train examples.
TINY = dataclasses.replace(
    scales.SCALES["smoke"],
    name="test",
    vocab_size=1000,
    main_size=scales.Size(1, 32, 2),
    ladder=(scales.Size(1, 32, 2),),
    max_seq_length=32,
    max_predictions=5,
    pretrain_batch=8,
    pretrain_steps=4,
    pretrain_learning_rate=1e-3,
    pretrain_warmup=1,
    eval_every=2,
    eval_batches=1,
    curve_steps=(2,),
    train_examples=16,
    dev_examples=8,
    finetune_seq_length=32,
    finetune_batch=8,
    learning_rates=(1e-3,),
)
ONLY = "finetune/bert/squad,finetune/ltr@2/qnli,bilstm/ltr/wnut16,feature_based/bert/wnut16"
WNUT_TYPES = {"PER": "person", "LOC": "geo-loc", "ORG": "company", "MISC": "other"}


def _data(root: pathlib.Path) -> pathlib.Path:
    """bench.paper.data's layout (bench/paper/DATA.md) from the suite's own text."""
    corpus = root / "corpus"
    corpus.mkdir(parents=True)
    with gzip.open(bundled.bundled_paths().train, "rt", encoding="utf-8") as f:
        chapters = f.read().split("\n\n")
    for name, part in (
        ("train-00000-of-00008.txt.gz", chapters[:60]),
        ("eval.txt.gz", chapters[60:80]),
    ):
        with gzip.open(corpus / name, "wt", encoding="utf-8") as f:
            f.write("\n\n".join(part) + "\n")
    squad = root / "tasks" / "squad"
    squad.mkdir(parents=True)
    files = {}
    for name in ("train-v1.1.json", "dev-v1.1.json"):
        files[name] = json.loads((TESTDATA / "squad" / name).read_text())
        (squad / name).write_text(json.dumps(files[name]))
    qnli = root / "tasks" / "qnli"
    qnli.mkdir()
    for name, out in (("train-v1.1.json", "train.tsv"), ("dev-v1.1.json", "dev.tsv")):
        pairs, _ = tasks.qnli_pairs(files[name]["data"])
        assert {p.label for p in pairs} == {"entailment", "not_entailment"}, name
        (qnli / out).write_text(tasks.qnli_tsv(pairs))
    wnut = root / "tasks" / "wnut16"
    wnut.mkdir()
    for name in ("train.txt", "dev.txt"):
        lines, previous = [], "O"
        for line in (TESTDATA / "ner" / name).read_text().splitlines():
            if line.startswith("-DOCSTART-") or not line.strip():
                lines.append("")
                previous = "O"
                continue
            word, *_, tag = line.split()
            if tag != "O":  # CoNLL-2003's IOB1 -> WNUT-16's BIO: an entity starts with B-
                kind = tag[2:]
                bio = "I" if tag[0] == "I" and previous[2:] == kind else "B"
                tag, previous = f"{bio}-{WNUT_TYPES[kind]}", tag
            else:
                previous = "O"
            lines.append(f"{word}\t{tag}")
        (wnut / name).write_text("\n".join(lines).strip() + "\n")
    return root


def _in_process(argv: list[str], log) -> int:
    """``bench.paper.run.launch`` in this process: ``[python, -m, module, flags...]``."""
    assert argv[1] == "-m", argv
    done = in_process.run_module(argv[2], *argv[3:])
    log.write(done.stdout + done.stderr)
    return done.returncode


def test_a_slice_of_the_plan_runs_end_to_end_and_reports(tmp_path, monkeypatch, capsys):
    data, out = _data(tmp_path / "data"), tmp_path / "out"
    # BERT alone gates (the ceiling, MiniLM continued, is the full scale's), at any score.
    monkeypatch.setattr(plan, "GATED_MODELS", ("bert",))
    monkeypatch.setattr(plan, "GATE_MARGIN", -100.0)
    runs = plan.select(plan.build(str(data), str(out), TINY, minilm_dir=""), ONLY)
    names = [r.name for r in runs]
    for expected in ("vocab/corpus", "pretrain/bert", "pretrain/ltr", "snapshot/ltr@2",
                     "finetune/bert/qnli", "finetune/bert/squad", "finetune/bert/wnut16",
                     "gate/wnut16", "finetune/ltr@2/qnli", "bilstm/ltr/wnut16",
                     "feature_based/bert/wnut16"):  # fmt: skip
        assert expected in names, names
    execute = lambda r, o: run._execute(r, o, launch=_in_process)  # noqa: E731
    run.write_plan(str(out), TINY, runs, ["pytest", __file__])
    failed = run.run_plan(runs, str(out), TINY.name, ["pytest", __file__], execute=execute)
    printed = capsys.readouterr().out
    logs = {p.name: p.read_text()[-2000:] for p in (out / "logs").glob("*.log")}
    assert failed == [], (
        failed,
        printed,
        {n: logs.get(n.replace("/", "__") + ".log") for n in failed},
    )
    for name in names:
        assert f"finished {name} in " in printed, printed
        record = json.loads(pathlib.Path(plan.results_path(str(out), name)).read_text())
        assert record["name"] == name and record["scale"] == "test" and record["commit"]
    results = lambda name: json.loads(  # noqa: E731
        pathlib.Path(plan.results_path(str(out), name)).read_text()
    )["results"]
    vocab = (out / "vocab.txt").read_text().splitlines()
    assert len(vocab) <= TINY.vocab_size and "[MASK]" in vocab
    # Pretraining: its held-out curve at each eval step, the objective's own accuracy.
    assert sorted(results("pretrain/ltr")["eval_curve"], key=int) == ["2", "4"]
    assert "mlm_accuracy" in results("pretrain/bert")["eval_curve"]["4"]
    # Each fine-tune is a sweep over the scale's rates and restarts, scored on its dev split.
    for name in ("finetune/bert/qnli", "finetune/bert/squad", "finetune/bert/wnut16",
                 "finetune/ltr@2/qnli", "bilstm/ltr/wnut16"):  # fmt: skip
        rows = results(name)["sweep"]["rows"]
        assert len(rows) == len(TINY.learning_rates) * TINY.restarts, (name, rows)
        assert all(0 <= r["score"] <= 100 for r in rows), (name, rows)
    table7 = results("feature_based/bert/wnut16")["feature_based"]["rows"]
    assert len(table7) == 6 * TINY.restarts, table7  # every combination, one head per seed
    # A new machine keeps only the records: a pretraining whose final step is lost while a run
    # that reads it is pending runs again (resuming from its kept step 2) and must reproduce its
    # recorded held-out curve; the finished fine-tune of the same snapshot is not rerun.
    ltr = next(r for r in runs if r.name == "pretrain/ltr")
    assert run._present(ltr, str(out), {"results": results("pretrain/ltr")})
    shutil.rmtree(out / "pretrain" / "ltr" / "checkpoints" / "4")
    assert not run._present(ltr, str(out), {"results": results("pretrain/ltr")})
    os.remove(plan.results_path(str(out), "snapshot/ltr@2"))
    shutil.rmtree(next(r for r in runs if r.name == "snapshot/ltr@2").workdir)
    assert run.run_plan(runs, str(out), TINY.name, ["pytest"], execute=execute) == []
    printed = capsys.readouterr().out
    assert "rerun    pretrain/ltr: equal to its record in " in printed, printed
    assert "finished snapshot/ltr@2 in " in printed and "done     finetune/ltr@2/qnli" in printed
    # The report: the paper's tables beside the miniature's cells, the runs not made named.
    output = tmp_path / "docs" / "paper_miniature.md"  # a folder the command makes
    reading = tmp_path / "reading.md"
    reading.write_text("## Reading\n\nNothing reproduces at this size, as expected.\n")
    assert report.main([f"--out_dir={out}", f"--output={output}", f"--reading={reading}"]) == 0
    markdown = output.read_text()
    assert markdown.index("## Reading\n\nNothing reproduces") < markdown.index("## Table 5")
    for heading in ("Table 5", "Table 6", "Table 7"):
        assert heading in markdown
    # Table 5's BiLSTM row and Table 7's six combinations hold the runs' dev F1s.
    assert re.search(r"^\| \+ BiLSTM \| missing \| missing \| \d+\.\d ± ", markdown, re.M), markdown
    # (the ceiling's column: not in this slice)
    f1s = re.findall(r"^\| feature-based: \w+ \| ([^|]+) \| missing \|", markdown, re.M)
    cell = rf"\d+\.\d ± \d+\.\d \(n={TINY.restarts}; best \d+\.\d\)"
    assert len(f1s) == 6 and all(re.fullmatch(cell, f) for f in f1s), markdown
    assert "## Missing runs\n\nNone." in markdown  # every run of the slice finished
    assert "![curves](paper_miniature_curves.png)" in markdown
    assert os.path.getsize(tmp_path / "docs" / "paper_miniature_curves.png") > 1000
    capsys.readouterr()
    assert report.main([f"--out_dir={out}", f"--output={output}/under_a_file.md"]) == 2
    (line,) = capsys.readouterr().err.splitlines()  # one line naming the flag, no traceback
    assert line.startswith(f"bench.paper.report: --output={output}/under_a_file.md: "), line
    assert report.main([f"--out_dir={out}", f"--reading={tmp_path}/nope.md"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"bench.paper.report: --reading={tmp_path}/nope.md: No such file or directory"
