"""``bertjax.finetune.inputs``: a resumed fine-tune takes its model, vocab and casing from its
workdir's record and reads its init checkpoint only when no step restores
(``bertjax.training.init_record``). Driven through ``loop.train_and_evaluate``, what
``python -m bertjax.finetune`` runs, with the tiny checkpoint and MRPC fixture of loop_test.py.
The resumed sweep's first sweep also checks the sweep's table (grid order, the best run marked,
its checkpoint kept).
"""

import json
import os
import shutil
import signal

import jax
import numpy as np
import pytest

from bertjax.finetune import loop, sweep
from bertjax.training import checkpoint, init_record
from bertjax.training import loop as loop_lib
from bertjax.training import workdir as workdir_lib
from tests.finetune.loop_test import _config, tiny_checkpoint

__all__ = ["tiny_checkpoint"]  # loop_test's fixture, instantiated for this module


def _sigterm_at_step(monkeypatch, step: int) -> None:
    """The next run gets SIGTERM while it takes the batch of ``step``: it saves that step and
    returns, as a preempted run does (``bertjax.training.preemption``)."""
    run = loop_lib.Loop.run

    def run_then_stop(self, state, batches):
        def signalled():
            for index, batch in enumerate(batches, start=int(state.step) + 1):
                if index == step:
                    os.kill(os.getpid(), signal.SIGTERM)
                yield batch

        return run(self, state, signalled())

    monkeypatch.setattr(loop_lib.Loop, "run", run_then_stop)


def _listing(path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_a_resumed_finetune_never_reads_its_init_checkpoint(
    testdata, tiny_checkpoint, tmp_path, monkeypatch, capsys
):
    """A fine-tune from a copy of the checkpoint (dropout on) is stopped by SIGTERM at step 2 of
    4 and the copy deleted: the rerun, given another path that holds nothing, restores step 2
    without reading either (one line says so; the record wins) and ends with the params and dev
    metrics of an uninterrupted run, bit for bit. Without a verified
    step the deleted copy is one line naming it and the workdir is left as it was; the original
    directory passed instead is a notice, read, checked against the record's fingerprint, and the
    run from step 0 ends as the uninterrupted one."""

    def config(init):
        config = _config("finetune_glue", task="mrpc", data_dir=str(testdata / "finetune/mrpc"),
                         init_checkpoint=str(init),
                         overrides={"train.num_epochs": 2.0})  # fmt: skip
        config.model.hidden_dropout_rate = config.model.attention_dropout_rate = 0.1
        return config

    movable, run, unsealed = tmp_path / "init", tmp_path / "run", tmp_path / "unsealed"
    shutil.copytree(tiny_checkpoint, movable)
    reference = loop.train_and_evaluate(config(tiny_checkpoint), str(tmp_path / "reference"))
    want, _, _ = checkpoint.load_params(tmp_path / "reference/checkpoint")
    _sigterm_at_step(monkeypatch, 2)
    assert loop.train_and_evaluate(config(movable), str(run)) == {"stopped": True}
    monkeypatch.undo()
    pretrained, _, _ = checkpoint.load_params(tiny_checkpoint)
    assert json.loads((run / workdir_lib.META_FILE).read_text())["init"] == {
        "source": str(movable), "format": "bertjax", "subtrees": ["encoder", "pooler"],
        "fresh": ["classifier"], "params_sha256": init_record.params_fingerprint(pretrained),
    }  # fmt: skip
    shutil.rmtree(movable)
    shutil.copytree(run, unsealed)  # as if killed before its first save was sealed
    for manifest in unsealed.glob("checkpoints/*/bertjax_manifest.json"):
        manifest.unlink()
    capsys.readouterr()

    # Rerun with the checkpoint's new place on the command line (nothing there either).
    results = loop.train_and_evaluate(config(tmp_path / "elsewhere"), str(run))
    out = capsys.readouterr().out
    assert f"config.init_checkpoint={tmp_path / 'elsewhere'}: {run} records {movable} as its " \
        "run's init checkpoint, and the record wins" in out  # fmt: skip
    assert f"restored step 2 from {run}/checkpoints\n" in out
    assert f"init_checkpoint {movable}: not read (step 2 restored; {run}'s record holds the " \
        "architecture, vocab and casing)\n" in out  # fmt: skip
    got, _, _ = checkpoint.load_params(run / "checkpoint")
    jax.tree.map(np.testing.assert_array_equal, got, want)
    assert results["dev"] == reference["dev"]

    before = _listing(unsealed)
    with pytest.raises(checkpoint.CheckpointError) as error:
        loop.train_and_evaluate(config(movable), str(unsealed))
    assert str(error.value) == (
        f"{movable}: no such checkpoint directory; {unsealed} holds no verified step, so its run "
        f"starts again from its init checkpoint (recorded: {movable}): put it back, or pass "
        "where it is now with --config.init_checkpoint"
    )
    assert _listing(unsealed) == before
    capsys.readouterr()

    results = loop.train_and_evaluate(config(tiny_checkpoint), str(unsealed))
    out = capsys.readouterr().out
    assert f"config.init_checkpoint={tiny_checkpoint}: {unsealed} records {movable} as its " \
        "run's init checkpoint, and the record wins" in out  # fmt: skip
    assert f"init_checkpoint {tiny_checkpoint}: read, as {unsealed} holds no verified step" in out
    assert "restored step" not in out
    got, _, _ = checkpoint.load_params(unsealed / "checkpoint")
    jax.tree.map(np.testing.assert_array_equal, got, want)
    assert results["dev"] == reference["dev"]


def test_a_resumed_sweep_takes_its_model_from_the_first_runs_record(
    testdata, tiny_checkpoint, tmp_path, capsys
):
    """A sweep of four runs (two learning rates, two restarts each) from a copy of the
    checkpoint writes its table: the runs in grid order, the best one marked, its checkpoint
    kept. The copy deleted and one run's workdir too (as if stopped before it started); the
    rerun, given the original directory: the other runs restore without reading it, that one
    reads it (checked against the first run's record) and trains; every dev score is the first
    sweep's."""
    movable, workdir = tmp_path / "init", tmp_path / "sweep"
    shutil.copytree(tiny_checkpoint, movable)
    config = _config("finetune_glue", task="mrpc", data_dir=str(testdata / "finetune/mrpc"),
                     init_checkpoint=str(movable))  # fmt: skip
    config.sweep.learning_rates, config.sweep.num_restarts = (1e-3, 1e-4), 2
    first = sweep.sweep(config, str(workdir))
    assert [(r["learning_rate"], r["seed"]) for r in first["rows"]] == [
        (1e-3, 0),
        (1e-3, 1),
        (1e-4, 0),
        (1e-4, 1),
    ]
    scores = [r["score"] for r in first["rows"]]
    assert scores[first["best"]] == max(scores)
    table = (workdir / "sweep_results.md").read_text()
    assert table.count("\n| ") == 4 and "**best**" in table
    assert (workdir / "checkpoint").exists()

    shutil.rmtree(movable)
    runs = workdir / sweep.RUNS_DIR
    shutil.rmtree(runs / "lr0.001_seed1")
    capsys.readouterr()
    config.init_checkpoint = str(tiny_checkpoint)
    again = sweep.sweep(config, str(workdir))
    out = capsys.readouterr().out
    assert f"resuming {runs / 'lr0.001_seed0'}, fine-tuned from {movable} (bertjax)" in out
    assert f"init_checkpoint {movable}: not read (step 2 restored; " in out
    assert f"config.init_checkpoint={tiny_checkpoint}: {runs / 'lr0.001_seed0'} records " \
        f"{movable} as its run's init checkpoint, and the record wins" in out  # fmt: skip
    assert out.count(f"init_checkpoint {tiny_checkpoint}: read, as ") == 1
    assert f"init_checkpoint {tiny_checkpoint}: read, as {runs / 'lr0.001_seed1'} holds no " \
        "verified step" in out  # fmt: skip
    assert [r["score"] for r in again["rows"]] == scores
