"""The real fine-tuning entry points, one short run per head type on the shipped fixtures.

A tiny randomly initialised bertjax checkpoint (MiniLM's 30,522-entry vocab) stands in for a
pretrained model; these tests check plumbing and output formats (tests/notebook_test.py checks
that learning happens, with MiniLM's real weights). The command's checks run
``bertjax.finetune`` as ``__main__`` in the test's process (``tests.commands.in_process``:
absl's flags, one-line errors, a start-up saved each), except the kill test's runs, which must
be processes; its uninterrupted reference run is also the STS-B end-to-end check. The sweep's
table is checked in inputs_test.py, with its resume.
"""

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from bertjax.finetune import glue, loop
from bertjax.finetune.tasks import FinetuneInputError
from bertjax.training import checkpoint
from bertjax.training import loop as loop_lib
from bertjax.training import workdir as workdir_lib
from tests import cpu_xla, zygote
from tests.commands import in_process

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _config(name: str, arg: str | None = None, *, task: str | None = None, data_dir: str,
            init_checkpoint: str, overrides: dict | None = None):  # fmt: skip
    """configs/NAME.py[:ARG] for a tiny, quick run of ``task`` (the config's own when None) on
    ``data_dir``; ``overrides``: dotted keys (``{"train.num_epochs": 2.0}``)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(arg) if arg else module.get_config()
    config.update_from_flattened_dict({
        "data.max_seq_length": 32, "train.global_batch_size": 8, "train.eval_batch_size": 8,
        "train.num_epochs": 1.0, "train.log_every": 1, "optimizer.learning_rate": 1e-3,
        "task.data_dir": data_dir, "init_checkpoint": init_checkpoint,
        **({"task.name": task} if task else {}), **(overrides or {}),
    })  # fmt: skip
    # No dropout: these runs check plumbing, and dropout's RNG doubles the step's compile time.
    config.model.hidden_dropout_rate = config.model.attention_dropout_rate = 0.0
    return config


@pytest.fixture
def tiny_checkpoint(tiny_encoder_checkpoint):
    """conftest's session checkpoint (H 32, 2 layers, MiniLM's vocab), read only."""
    return tiny_encoder_checkpoint


def test_glue_train_then_predict(testdata, tiny_checkpoint, tmp_path):
    config = _config(
        "finetune_glue",
        task="mrpc",
        data_dir=str(testdata / "finetune/mrpc"),
        init_checkpoint=tiny_checkpoint,
    )
    results = loop.train_and_evaluate(config, str(tmp_path))
    assert set(results["dev"]["dev"]) == {"f1", "accuracy", "num_examples"}
    assert json.loads((tmp_path / "eval_results.json").read_text())["task"] == "mrpc"
    assert (tmp_path / "predictions/MRPC.tsv").read_text().startswith("index\tprediction\n0\t")
    assert os.listdir(tmp_path / "tensorboard")
    saved, _, meta = checkpoint.load_params(tmp_path / "checkpoint")
    assert sorted(meta["heads"]) == ["classifier", "pooler"]
    # predict mode reruns the saved model on the test file and reproduces the same submission
    first = (tmp_path / "predictions/MRPC.tsv").read_text()
    (tmp_path / "predictions/MRPC.tsv").unlink()
    config.mode = "predict"
    assert "MRPC.tsv" in loop.predict(config, str(tmp_path))
    assert (tmp_path / "predictions/MRPC.tsv").read_text() == first


def test_checkpoint_hidden_size_mismatch(testdata, tiny_checkpoint, tmp_path):
    config = _config(
        "finetune_glue",
        task="mrpc",
        data_dir=str(testdata / "finetune/mrpc"),
        init_checkpoint=tiny_checkpoint,
    )
    config.model.hidden_size = 768
    with pytest.raises(
        FinetuneInputError,
        match=r"checkpoint hidden size 32 != "
        r"config.model.hidden_size=768",
    ):
        loop.train_and_evaluate(config, str(tmp_path))


def _conll_columns(path) -> list[list[str]]:
    """Non-blank, non-DOCSTART lines of a CoNLL file, split on spaces."""
    lines = [line.split() for line in path.read_text().splitlines()]
    return [cols for cols in lines if cols and cols[0] != "-DOCSTART-"]


def _check_squad(out, data, reported):
    """predictions.json answers every dev question, and the official script's scores on that
    file (evaluate-v2.0.py, which scores v1.1 answers as evaluate-v1.1.py does) are the ones
    reported."""
    from tests.finetune.metrics_test import official_v2

    dataset = json.loads((data / "dev-v1.1.json").read_text())["data"]
    predictions = json.loads((out / "predictions.json").read_text())
    qids = [qa["id"] for a in dataset for p in a["paragraphs"] for qa in p["qas"]]
    assert sorted(predictions) == sorted(qids)
    official = official_v2(dataset, predictions, dict.fromkeys(qids, 0.0))
    assert reported["exact"] == pytest.approx(official["exact"])
    assert reported["f1"] == pytest.approx(official["f1"])


def _check_ner(out, data, reported):
    """Every dev token, with its gold tag from dev.txt, gets one predicted tag from the task's
    label set; the entity F1 of those columns is the one reported."""
    from bertjax.finetune import metrics

    gold = _conll_columns(data / "dev.txt")
    written = _conll_columns(out / "dev_predictions.txt")
    assert [(c[0], c[-1]) for c in gold] == [(c[0], c[1]) for c in written]
    from bertjax.finetune import ner  # noqa: PLC0415

    assert {c[2] for c in written} <= set(ner.CONLL2003_LABELS)  # the task's tags
    sentences = (out / "dev_predictions.txt").read_text().strip().split("\n\n")
    columns = [[line.split() for line in s.splitlines()] for s in sentences]
    again = metrics.conlleval(
        [[c[1] for c in s] for s in columns], [[c[2] for c in s] for s in columns]
    )
    assert reported["f1"] == pytest.approx(again["f1"])


def _check_swag(out, data, reported):
    """One prediction in 0..3 per val.csv row, with its gold label; their accuracy is the one
    reported."""
    import csv

    with open(data / "val.csv", newline="") as f:
        gold = [(row["fold-ind"], int(row["label"])) for row in csv.DictReader(f)]
    with open(out / "dev_predictions.csv", newline="") as f:
        rows = [(r["id"], int(r["prediction"]), int(r["label"])) for r in csv.DictReader(f)]
    assert [(i, label) for i, _, label in rows] == gold
    assert {p for _, p, _ in rows} <= {0, 1, 2, 3}
    accuracy = 100.0 * np.mean([p == label for _, p, label in rows])
    assert reported["accuracy"] == pytest.approx(accuracy)


@pytest.mark.parametrize(
    "name,arg,task,data,check",
    [
        ("finetune_squad", "v1", "squad_v1", "squad", _check_squad),
        ("finetune_ner", None, "conll2003", "ner", _check_ner),
        ("finetune_swag", None, "swag", "swag", _check_swag),
    ],
)
def test_other_heads_report_what_their_prediction_files_score(
    testdata, tiny_checkpoint, tmp_path, name, arg, task, data, check
):
    config = _config(
        name,
        arg,
        task=task,
        data_dir=str(testdata / "finetune" / data),
        init_checkpoint=tiny_checkpoint,
        overrides={"data.do_lower_case": True},
    )
    results = loop.train_and_evaluate(config, str(tmp_path))
    assert np.isfinite(results["final_train_loss"])
    reported = json.loads((tmp_path / "eval_results.json").read_text())["dev"]["dev"]
    assert reported == results["dev"]["dev"]
    check(tmp_path / "predictions", testdata / "finetune" / data, reported)


def _cli(config: str, *flags: str, env=None) -> subprocess.CompletedProcess:
    """``python -m bertjax.finetune --config=configs/CONFIG FLAGS...`` (8 fake CPU devices, or
    ``env``'s)."""
    return zygote.run(
        [sys.executable, "-m", "bertjax.finetune", f"--config={ROOT}/configs/{config}", *flags],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env=env,
    )


def _finetune_here(config: str, *flags: str) -> subprocess.CompletedProcess:
    """:func:`_cli`'s command, in this process (``tests.commands.in_process``)."""
    return in_process.run_module("bertjax.finetune", f"--config={ROOT}/configs/{config}", *flags)


def _one_device_env(tmp_path) -> dict:
    """One CPU device, XLA at -O0 and a compile cache the runs share: a tiny model's runs are
    all start-up and compiling."""
    return cpu_xla.environ(
        1,
        JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"),
    )


def test_cli_bad_input_is_one_line(testdata, tiny_checkpoint, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.tsv").write_text("sentence\tlabel\ngood\t1\nbad\t0\textra\n")
    result = _finetune_here(
        "finetune_glue.py",
        "--config.task.name=sst2",
        f"--config.task.data_dir={data}",
        f"--config.init_checkpoint={tiny_checkpoint}",
        f"--workdir={tmp_path}/out",
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"finetune: error: {data}/train.tsv:3: "
        "expected 2 tab-separated columns like the header, got 3"
    )


def test_cli_header_only_dev_file_fails_before_training(testdata, tiny_checkpoint, tmp_path):
    """All splits are read before the model is built: an empty dev split is one line on stderr
    and the workdir is never created (no predictions/ or tensorboard/ from a wasted run)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.tsv").write_bytes((testdata / "finetune/mrpc/train.tsv").read_bytes())
    header = (testdata / "finetune/mrpc/dev.tsv").read_text().splitlines()[0]
    (data / "dev.tsv").write_text(header + "\n")
    workdir = tmp_path / "out"
    result = _finetune_here(
        "finetune_glue.py",
        "--config.task.name=mrpc",
        f"--config.task.data_dir={data}",
        f"--config.init_checkpoint={tiny_checkpoint}",
        f"--workdir={workdir}",
        *_SMALL,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"finetune: error: {data}/dev.tsv: no examples in the dev split "
        "(an empty file, or only a header?)"
    ]
    assert not workdir.exists()


# Small-run flags for the CLI: tiny sequences, no dropout (plumbing, not learning).
_SMALL = (
    "--config.data.max_seq_length=48",
    "--config.train.global_batch_size=8",
    "--config.train.eval_batch_size=8",
    "--config.optimizer.learning_rate=1e-3",
    "--config.train.log_every=1",
    "--config.model.hidden_dropout_rate=0.0",
    "--config.model.attention_dropout_rate=0.0",
)


def _check_stsb_end_to_end(stdout: str, workdir: pathlib.Path, data: pathlib.Path) -> None:
    """An STS-B run's outputs: progress like pretraining's (a line after the first step, then
    every log_every steps, with rates and an ETA; one line per evaluated split with its
    metrics), dev metrics that scipy computes from the written dev predictions, and the GLUE
    submission file."""
    stats = pytest.importorskip("scipy.stats")
    lines = stdout.splitlines()
    assert "stsb/train: 16 examples -> 16 features" in lines
    progress = [x for x in lines if x.startswith("step ")]
    assert re.fullmatch(r"step 1/\d+ loss [\d.]+ lr \S+ grad_norm [\d.]+ seq/s [\d.]+ tok/s \d+ "
                        r"inst/step 8.0 tok/step \d+ gflop/s/dev [\d.]+ input_wait [\d.]+% "
                        r"host [\d.]+[kM]?/s/core eta \?",
                        progress[0]), progress  # fmt: skip
    assert any(x.startswith("eval dev: ") and " pearson " in x for x in lines), lines
    dev = json.loads((workdir / "eval_results.json").read_text())["dev"]["dev"]
    assert dev["num_examples"] == 8
    # Reference: scipy on the written dev predictions against the gold scores of dev.tsv.
    rows = [line.split("\t") for line in (workdir / "predictions/dev_predictions.tsv").open()]
    assert rows[0] == ["index", "prediction", "label\n"]
    predicted = [float(r[1]) for r in rows[1:]]
    gold = [float(line.split("\t")[-1]) for line in (data / "dev.tsv").open().readlines()[1:]]
    assert [float(r[2]) for r in rows[1:]] == gold
    # (abs 1e-4: a tiny model's scores differ only in the 5th digit, so the correlation is
    # ill-conditioned; the metric definitions are checked at 1e-12 in finetune_metrics_test.py)
    assert dev["pearson"] == pytest.approx(100 * stats.pearsonr(predicted, gold)[0], abs=1e-4)
    assert dev["spearman"] == pytest.approx(100 * stats.spearmanr(predicted, gold)[0], abs=1e-4)
    # The GLUE submission file: STS-B.tsv, index<TAB>score for every test.tsv row.
    submission = (workdir / "predictions/STS-B.tsv").read_text().splitlines()
    assert submission[0] == "index\tprediction"
    assert [line.split("\t")[0] for line in submission[1:]] == ["0", "1", "2", "3"]
    assert all(np.isfinite(float(line.split("\t")[1])) for line in submission[1:])


def test_cli_squad_v2_end_to_end(testdata, tiny_checkpoint, tmp_path):
    from tests.finetune.metrics_test import official_v2

    data = testdata / "finetune/squad"
    result = _finetune_here(
        "finetune_squad.py:v2",
        f"--config.task.data_dir={data}",
        f"--config.init_checkpoint={tiny_checkpoint}",
        f"--workdir={tmp_path}",
        "--config.data.do_lower_case=true",
        "--config.task.doc_stride=16",
        "--config.train.num_epochs=1",
        *_SMALL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "predictions"
    assert sorted(os.listdir(out)) == [
        "nbest_predictions.json",
        "null_odds.json",
        "predictions.json",
        "predictions_best_thresh.json",
    ]
    dataset = json.loads((data / "dev-v2.0.json").read_text())["data"]
    predictions = json.loads((out / "predictions.json").read_text())
    null_odds = json.loads((out / "null_odds.json").read_text())
    qids = [qa["id"] for a in dataset for p in a["paragraphs"] for qa in p["qas"]]
    assert sorted(predictions) == sorted(null_odds) == sorted(qids)
    assert all(isinstance(v, float) for v in null_odds.values())
    # evaluate-v2.0.py dev-v2.0.json predictions.json --na-prob-file null_odds.json
    official = official_v2(dataset, predictions, null_odds)
    reported = json.loads((tmp_path / "eval_results.json").read_text())["dev"]["dev"]
    for key, value in official.items():
        assert reported[key] == pytest.approx(value), key
    # The README's second pass: answers at best_f1_thresh, taken from the n-best list.
    threshold = official["best_f1_thresh"]
    nbest = json.loads((out / "nbest_predictions.json").read_text())
    again = {
        q: "" if null_odds[q] > threshold else next(e["text"] for e in nbest[q] if e["text"])
        for q in qids
    }
    assert json.loads((out / "predictions_best_thresh.json").read_text()) == again
    at_best = official_v2(dataset, again, {q: 0.0 for q in qids})
    assert reported["best_f1_thresh_f1"] == pytest.approx(at_best["f1"])
    assert reported["best_f1_thresh_exact"] == pytest.approx(at_best["exact"])


def test_a_failed_output_write_leaves_no_partial_outputs(
    testdata, tiny_checkpoint, tmp_path, monkeypatch
):
    """The disk fills up while the outputs are written (after the fine-tuned checkpoint, at the
    predictions): one line, none of the outputs (checkpoint, predictions, eval_results.json) nor
    their staging directory is left in the workdir; the train state stays and verifies, so a
    rerun re-evaluates from it and completes."""
    config = _config(
        "finetune_glue",
        task="stsb",
        data_dir=str(testdata / "finetune/stsb"),
        init_checkpoint=tiny_checkpoint,
    )

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(glue.GlueTask, "write_predictions", full)
    with pytest.raises(checkpoint.CheckpointError) as error:
        loop.train_and_evaluate(config, str(tmp_path))
    assert str(error.value).startswith(f"writing the outputs into {tmp_path} failed (OSError: ")
    assert "nothing was written" in str(error.value)
    left = {p.name for p in tmp_path.iterdir()}
    assert not left & {"checkpoint", "predictions", "eval_results.json"}, left
    assert not [name for name in left if name.startswith(".outputs")], left
    assert workdir_lib.latest_params(tmp_path)[0]  # the train state verifies
    monkeypatch.undo()
    results = loop.train_and_evaluate(config, str(tmp_path))
    assert (tmp_path / "eval_results.json").exists() and results["dev"]["dev"]


def test_cli_kill_9_between_commit_and_seal_then_resume_is_bit_exact(
    testdata, tiny_checkpoint, tmp_path
):
    """A GLUE (STS-B) fine-tune (dropout on) at the shipped ``config.checkpoint.keep`` (1)
    killed with SIGKILL between orbax's commit of its second saved step and that step's seal
    (``tests/held_seal.py``) and rerun: the first saved step survived
    (``bertjax.training.retention``), the rerun restores it and ends with the same fine-tuned
    params, bit for bit, and the same dev metrics as a run that was never interrupted. That
    uninterrupted run is also the command's STS-B end-to-end check
    (:func:`_check_stsb_end_to_end`)."""
    data = testdata / "finetune/stsb"
    flags = [
        "--config.task.name=stsb",
        f"--config.task.data_dir={data}",
        f"--config.init_checkpoint={tiny_checkpoint}",
        "--config.data.max_seq_length=48",
        "--config.train.global_batch_size=8",
        "--config.train.eval_batch_size=8",
        "--config.optimizer.learning_rate=1e-3",
        "--config.train.log_every=10",
        "--config.train.num_epochs=20",  # 16 pairs / 8 = 2 updates an epoch: 40 steps
        "--config.checkpoint.every_steps=10",
    ]
    config = f"{ROOT}/configs/finetune_glue.py"
    env = _one_device_env(tmp_path)
    reference = _cli("finetune_glue.py", f"--workdir={tmp_path}/reference", *flags, env=env)
    assert reference.returncode == 0, reference.stderr[-3000:]
    _check_stsb_end_to_end(reference.stdout, tmp_path / "reference", data)
    run, marker = tmp_path / "run", tmp_path / "seal-20-held"
    argv = [sys.executable, "-m", "tests.held_seal", "20", str(marker), "bertjax.finetune",
            f"--config={config}", f"--workdir={run}"]  # fmt: skip
    proc = zygote.popen(
        [*argv, *flags], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=env,
    )  # fmt: skip
    while not marker.exists() and proc.poll() is None:
        time.sleep(0.01)
    window = (run / "checkpoints/20").is_dir() and not (
        run / "checkpoints/20/bertjax_manifest.json"
    ).exists()
    proc.kill()
    proc.wait()
    assert proc.returncode == -9 and window, proc.stderr.read()[-3000:]  # killed in the window
    assert not (run / "eval_results.json").exists()
    # The rerun keeps every 20th step for good beside keep=1 (config.checkpoint.keep_every).
    resumed = _cli("finetune_glue.py", f"--workdir={run}", *flags,
                   "--config.checkpoint.keep_every=20", env=env)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "checkpoint step 20: no manifest (incomplete save); trying step 10" in resumed.stdout
    assert re.search(r"^restored step 10 from ", resumed.stdout, re.M), resumed.stdout[-2000:]
    assert sorted(int(p.name) for p in (run / "checkpoints").iterdir()) == [20, 40]
    got, _, _ = checkpoint.load_params(run / "checkpoint")
    want, _, _ = checkpoint.load_params(tmp_path / "reference/checkpoint")
    jax.tree.map(np.testing.assert_array_equal, got, want)
    dev = lambda path: json.loads((path / "eval_results.json").read_text())["dev"]
    assert dev(run) == dev(tmp_path / "reference")


@pytest.mark.usefixtures("full_optimizations")  # -O0 steps would take as long as the waits
def test_an_input_bound_run_shows_its_wait_and_warns_once(
    testdata, tiny_checkpoint, tmp_path, monkeypatch, capsys
):
    """Host batches that take 0.3 s each (a slow pipeline): every line shows the wait, and after
    three input-bound intervals past the first (which includes compiling) one warning line."""
    run = loop_lib.Loop.run

    def slow_run(self, state, batches):
        def slow():
            for batch in batches:
                time.sleep(0.3)
                yield batch

        return run(self, state, slow())

    monkeypatch.setattr(loop_lib.Loop, "run", slow_run)
    config = _config(
        "finetune_glue", task="mrpc", data_dir=str(testdata / "finetune/mrpc"),
        init_checkpoint=tiny_checkpoint, overrides={"train.num_epochs": 4.0},
    )  # fmt: skip
    loop.train_and_evaluate(config, str(tmp_path))
    lines = capsys.readouterr().out.splitlines()
    waits = [float(m) for x in lines for m in re.findall(r" input_wait ([\d.]+)% host ", x)]
    assert len(waits) == 8 and min(waits[1:]) > 50.0, lines  # steps 1-8, each waits 0.3 s
    warnings = [i for i, x in enumerate(lines) if x.startswith("WARNING: input-bound: ")]
    assert len(warnings) == 1, lines
    assert lines[warnings[0] - 1].startswith("step 4/8 "), lines  # after windows 2, 3 and 4
