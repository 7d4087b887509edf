"""The ModernBERT recipe as configs ship it: ``configs/modernbert_base.py``'s two phases and
``configs/modernbert_tiny.py``, run in-process on a slice of the bundled corpus: the tiny recipe
(packed rows, MLM at 30% without NSP, StableAdamW, a batch-size warm-up, a 1-sqrt cooldown)
resumes bit-exactly from a checkpoint in the middle of a batch size, and phase 2 (8,192 tokens,
global RoPE base 160,000) resumes phase 1's workdir, which a BERT run may not do with the same
changes."""

import pathlib
import re
import sys

import jax
import numpy as np
import pytest

from bertjax.training import checkpoint
from bertjax.training import workdir as workdir_lib
from tests.commands import tiny_run

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "configs"))
import modernbert_base  # noqa: E402
import modernbert_tiny  # noqa: E402


def _tiny(tmp_path, num_steps, **train):
    corpus = tiny_run.write_env(tmp_path)
    config = modernbert_tiny.get_config().unlock()
    config.model.update(hidden_size=32, num_heads=2, intermediate_size=48, num_layers=3,
                        local_attention=8, max_position_embeddings=32)  # fmt: skip
    config.data.update(input_files=[str(corpus)], eval_input_files=[str(corpus)],
                       max_seq_length=32, max_predictions_per_seq=10,
                       cache_dir=str(tmp_path / "cache"))  # fmt: skip
    config.train.update(num_steps=num_steps, global_batch_size=16, eval_every=0, log_every=1,
                        batch_warmup_tokens=0)  # fmt: skip
    config.train.update(train)
    # One schedule of 6 steps (2 of warmup, 3 of cooldown) whatever num_steps stops the run at.
    config.optimizer.update(warmup_steps=2, cooldown_steps=3, decay_steps=6)
    config.checkpoint.every_steps = 2
    return config.lock()


def _recording(monkeypatch) -> list:
    """Every run's host batches from now on: [[input_ids of each step] of each run]."""
    from bertjax.training import loop as loop_lib  # noqa: PLC0415

    runs, run = [], loop_lib.Loop.run

    def recorded(self, state, batches):
        runs.append([])
        return run(self, state, (runs[-1].append(b["input_ids"].copy()) or b for b in batches))

    monkeypatch.setattr(loop_lib.Loop, "run", recorded)
    return runs


def test_the_tiny_recipe_resumes_mid_warm_up_reading_the_stream_in_order(
    tmp_path, capsys, monkeypatch
):
    """The tiny recipe with its batch-size warm-up: the batch grows 8 -> 16 -> 24 rows and stays
    at 32 (2 steps a size); the schedule's 6 full-batch steps have 2 of warmup and end with a
    1-sqrt cooldown of 3, which steps 7 and 8 enter. A run stopped at step 3, in the middle of a
    size, resumes with the rows an uninterrupted run reads at each step (the data position is
    counted in units of the sizes' gcd), through the cooldown, and ends bit-identical."""
    from bertjax.pretrain import loop  # noqa: PLC0415

    warm_up = dict(global_batch_size=32, batch_warmup_start=8, batch_warmup_stages=3,
                   batch_warmup_tokens=2 * 32 * (8 + 16 + 24))  # fmt: skip
    runs = _recording(monkeypatch)
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    loop.train_and_evaluate(_tiny(tmp_path, 8, **warm_up), str(whole))
    out = capsys.readouterr().out
    assert "batch-size warm-up: 8, 16, 24 rows, 2 steps each (steps 0-5, 3,072 tokens)" in out, out
    # The learning rate counts full-batch steps (rows before the update / 32: 0, .25, .5, 1,
    # 1.5, 2.25, 3, 4): update 1 takes 0.25 / 2 (warmup_steps) of the peak, 5e-4; update 6
    # starts the cooldown at 3 of the schedule's 6; update 7 is a third into it (1 - sqrt).
    lrs = {int(m[1]): float(m[2]) for m in re.finditer(r"^step (\d)/8 .* lr (\S+) ", out, re.M)}
    assert lrs[2] == pytest.approx(6.25e-5) and lrs[7] == pytest.approx(5e-4), lrs
    assert lrs[8] == pytest.approx(5e-4 * (1 - (1 / 3) ** 0.5), rel=1e-2), lrs
    loop.train_and_evaluate(_tiny(tmp_path, 3, **warm_up), str(halves))
    loop.train_and_evaluate(_tiny(tmp_path, 8, **warm_up), str(halves))
    out = capsys.readouterr().out
    assert "restored step 3 " in out
    # No NSP in the recipe: its untrained head's loss and accuracy are neither shown nor kept.
    assert " mlm_acc " in out and "nsp" not in out, out[-2000:]
    want, first, second = runs
    assert [len(b) for b in want] == [8, 8, 16, 16, 24, 24, 32, 32]
    for step, (a, b) in enumerate(zip(want, first + second, strict=True)):
        np.testing.assert_array_equal(b, a, err_msg=f"step {step}")
    # The rows are the stream's in order: step 1's rows are not step 0's again.
    assert not np.array_equal(want[0], want[1])
    got, *_ = workdir_lib.latest_params(halves)
    expected, *_ = workdir_lib.latest_params(whole)
    leaves = jax.tree.leaves_with_path(expected)
    assert any("mlp_norm" in jax.tree_util.keystr(p) for p, _ in leaves)  # the modern layers
    for (path, a), b in zip(leaves, jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a), err_msg=str(path))


def test_phase_2_extends_the_context_of_phase_1s_workdir(tmp_path):
    one, two = modernbert_base.get_config("ettin-17m,1"), modernbert_base.get_config("ettin-17m,2")
    assert (one.data.max_seq_length, two.data.max_seq_length) == (1024, 8192)
    assert (one.model.global_rope_theta, two.model.global_rope_theta) == (10_000.0, 160_000.0)
    assert two.optimizer.cooldown_steps == two.train.num_steps - modernbert_base.PHASE1_STEPS
    assert (one.data.nsp, one.data.masked_lm_prob, one.optimizer.name) == (
        False, 0.3, "stable_adamw")  # fmt: skip
    from bertjax.pretrain import objective  # noqa: PLC0415

    first, second = objective.bert_config_from(one), objective.bert_config_from(two)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n")
    workdir_lib.write_record(tmp_path / "run", first, str(vocab), True, "{}")
    workdir_lib.check_resumable(tmp_path / "run", second, str(vocab), False)  # accepted
    bert_one = first.replace(architecture="bert")
    workdir_lib.write_record(tmp_path / "bert", bert_one, str(vocab), True, "{}")
    with pytest.raises(checkpoint.CheckpointError, match=r"global_rope_theta 10000.0 -> 160000"):
        workdir_lib.check_resumable(tmp_path / "bert", bert_one.replace(global_rope_theta=160e3),
                                    str(vocab), False)  # fmt: skip


def test_modernbert_counts_its_batch_in_packed_rows_and_bert_in_instances(monkeypatch):
    """ModernBERT's 4,608 are packed rows (its SequencePacker's pseqs), so a step holds 4.7M
    token slots at 1,024 and at 8,192; BERT's 256 are instances, turned into rows at the data's
    instances per row. The one resolver (``bertjax.pretrain.inputs.resolve_packed_batch``)."""
    from bertjax.data import pipeline  # noqa: PLC0415
    from bertjax.pretrain import inputs  # noqa: PLC0415
    from bertjax.training import sharding  # noqa: PLC0415

    for phase in ("1", "2"):
        config = modernbert_base.get_config(f"base,{phase}")
        assert (config.train.batch_unit, config.train.global_batch_size) == ("rows", 4608)
    mesh = sharding.create_mesh((8, 1, 1))
    config = modernbert_tiny.get_config().unlock()
    config.train.update(global_batch_size=64, eval_batch_size=32)
    monkeypatch.setattr(pipeline, "instances_per_row", lambda data, seed: 2.0)
    counted = inputs.resolve_packed_batch(config, mesh, 1, announce=False)
    assert (counted.train.global_batch_size, counted.train.eval_batch_size) == (32, 16)
    assert counted.train.batch_warmup_start == 8  # the warm-up's start in the same unit
    config.train.batch_unit = "rows"
    monkeypatch.setattr(pipeline, "instances_per_row", lambda data, seed: 1 / 0)  # never read
    rows = inputs.resolve_packed_batch(config, mesh, 1, announce=False)
    assert (rows.train.global_batch_size, rows.train.eval_batch_size) == (64, 32)
    assert rows.train.batch_warmup_start == 16
    config.train.batch_unit = "tokens"
    with pytest.raises(ValueError, match=r"^config.train.batch_unit='tokens': expected one of "
                       r"instances, rows$"):  # fmt: skip
        inputs.resolve_packed_batch(config, mesh, 1)
