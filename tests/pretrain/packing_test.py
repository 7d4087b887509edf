"""Packed rows compute exactly what their instances compute alone (dropout off): the packed-row
contract of ``bertjax.data.pipeline`` through the model (attention by sequence ids, position ids
from ``positions``, NSP per [CLS]) and the pretraining objective (MLM unchanged, NSP the mean over
real instances).

The packing here is the contract's definition written out by hand (instances concatenated, their
positions restarting, masked positions shifted to row positions), independent of
``bertjax.data.packing``: a packed batch and the unpacked batch of the same instances must give
every instance the same hidden states, and the train step the same loss and gradients.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.model.config import BertConfig
from bertjax.model.encoder import BertEncoder
from bertjax.model.heads import BertForPreTraining
from bertjax.pretrain import objective as objective_lib
from bertjax.training import step as step_lib

LENGTH, PREDICTIONS, K = 32, 4, 3
# Instance lengths; packed rows: [0, 1, 2] fill 31 of 32 slots, [3, 4] 27, [5] (alone) 7.
LENGTHS = (12, 9, 10, 15, 12, 7)
PACKS = ((0, 1, 2), (3, 4), (5,))


def _config(**overrides) -> BertConfig:
    return BertConfig(vocab_size=40, hidden_size=16, num_layers=2, num_heads=4,
                      intermediate_size=32, max_position_embeddings=LENGTH,
                      hidden_dropout_rate=0.0, attention_dropout_rate=0.0,
                      **overrides)  # fmt: skip


def _instances(seed=0, lengths=LENGTHS):
    """One dict per instance of its own length: ids ([CLS]=2 first), segment ids, up to
    PREDICTIONS masked positions (increasing, > 0) with their labels, an NSP label."""
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        ids = rng.integers(5, 40, n).astype(np.int32)
        ids[0] = 2
        split = int(rng.integers(2, n - 1))
        count = int(rng.integers(1, PREDICTIONS + 1))
        out.append({
            "ids": ids,
            "segments": (np.arange(n) >= split).astype(np.int32),
            "masked": np.sort(rng.choice(np.arange(1, n), count, replace=False)).astype(np.int32),
            "labels": rng.integers(5, 40, count).astype(np.int32),
            "nsp": int(rng.integers(0, 2)),
        })  # fmt: skip
    return out


def _unpacked(instances) -> dict:
    rows = len(instances)
    batch = {
        "input_ids": np.zeros((rows, LENGTH), np.int32),
        "segment_ids": np.zeros((rows, LENGTH), np.int32),
        "input_mask": np.zeros((rows, LENGTH), np.int32),
        "masked_lm_positions": np.zeros((rows, PREDICTIONS), np.int32),
        "masked_lm_ids": np.zeros((rows, PREDICTIONS), np.int32),
        "masked_lm_weights": np.zeros((rows, PREDICTIONS), np.float32),
        "next_sentence_labels": np.zeros((rows,), np.int32),
    }
    for r, inst in enumerate(instances):
        n, p = len(inst["ids"]), len(inst["masked"])
        batch["input_ids"][r, :n] = inst["ids"]
        batch["segment_ids"][r, :n] = inst["segments"]
        batch["input_mask"][r, :n] = 1
        batch["masked_lm_positions"][r, :p] = inst["masked"]
        batch["masked_lm_ids"][r, :p] = inst["labels"]
        batch["masked_lm_weights"][r, :p] = 1
        batch["next_sentence_labels"][r] = inst["nsp"]
    return batch


def _packed(instances, packs=PACKS) -> dict:
    """The packed-row contract, by hand: K instances per row at most, K * PREDICTIONS slots."""
    rows, predictions = len(packs), K * PREDICTIONS
    batch = {
        "input_ids": np.zeros((rows, LENGTH), np.int32),
        "segment_ids": np.zeros((rows, LENGTH), np.int32),
        "input_mask": np.zeros((rows, LENGTH), np.int32),
        "positions": np.zeros((rows, LENGTH), np.int32),
        "sequence_ids": np.zeros((rows, LENGTH), np.int32),
        "masked_lm_positions": np.zeros((rows, predictions), np.int32),
        "masked_lm_ids": np.zeros((rows, predictions), np.int32),
        "masked_lm_weights": np.zeros((rows, predictions), np.float32),
        "cls_positions": np.zeros((rows, K), np.int32),
        "next_sentence_labels": np.zeros((rows, K), np.int32),
        "instance_weights": np.zeros((rows, K), np.float32),
    }
    for r, pack in enumerate(packs):
        start = predicted = 0
        for j, i in enumerate(pack):
            inst = instances[i]
            n, p = len(inst["ids"]), len(inst["masked"])
            row = slice(start, start + n)
            batch["input_ids"][r, row] = inst["ids"]
            batch["segment_ids"][r, row] = inst["segments"]
            batch["input_mask"][r, row] = 1
            batch["positions"][r, row] = np.arange(n)
            batch["sequence_ids"][r, row] = j + 1
            batch["masked_lm_positions"][r, predicted : predicted + p] = start + inst["masked"]
            batch["masked_lm_ids"][r, predicted : predicted + p] = inst["labels"]
            batch["masked_lm_weights"][r, predicted : predicted + p] = 1
            batch["cls_positions"][r, j] = start
            batch["next_sentence_labels"][r, j] = inst["nsp"]
            batch["instance_weights"][r, j] = 1
            start, predicted = start + n, predicted + p
    return batch


@functools.cache
def _params(seed=0):
    """Params of ``_config()``, drawn once for every test here: ``attention`` and
    ``gather_last_layer`` leave the tree as it is."""
    ids = np.zeros((1, LENGTH), np.int32)
    positions = np.zeros((1, PREDICTIONS), np.int32)
    init = jax.jit(lambda key: BertForPreTraining(_config()).init(key, ids, ids, ids, positions))
    return jax.device_get(init(jax.random.key(seed))["params"])


@pytest.mark.parametrize("attention", ["bidirectional", "causal"])
def test_each_packed_instance_gets_its_hidden_states_alone(attention):
    """Encoder + pooler: every instance's token states in a packed row equal the same instance
    alone in its own row (causal: within the instance), and its pooled [CLS] too."""
    cfg = _config(attention=attention)
    params = _params()
    instances = _instances()
    alone, packed = _unpacked(instances), _packed(instances)

    @jax.jit
    def states_and_nsp_logits(p, b):  # one program per batch: two compiles, not four
        mask, positions = b.get("sequence_ids", b["input_mask"]), b.get("positions")
        states = BertEncoder(cfg).apply(
            {"params": p["encoder"]}, b["input_ids"], b["segment_ids"], mask, positions=positions
        )
        out = BertForPreTraining(cfg).apply(
            {"params": p}, b["input_ids"], b["segment_ids"], mask, b["masked_lm_positions"],
            positions=positions, cls_positions=b.get("cls_positions"),
        )  # fmt: skip
        return states.sequence_output, out.nsp_logits

    states, logits = jax.device_get(states_and_nsp_logits(params, packed))
    ref, ref_logits = jax.device_get(states_and_nsp_logits(params, alone))
    for r, pack in enumerate(PACKS):
        start = 0
        for i in pack:
            n = LENGTHS[i]
            np.testing.assert_allclose(
                states[r, start : start + n], ref[i, :n], rtol=1e-5, atol=1e-5
            )
            start += n
    assert logits.shape == (len(PACKS), K, 2)
    for r, pack in enumerate(PACKS):
        for j, i in enumerate(pack):
            np.testing.assert_allclose(logits[r, j], ref_logits[i], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gather_last_layer", [True, False])
def test_a_packed_step_has_the_unpacked_loss_and_gradients(gather_last_layer):
    """The objective's loss (mean MLM over masked tokens + mean NSP over real instances) and its
    gradient for every parameter: packed batch == the same instances unpacked."""
    cfg = _config(gather_last_layer=gather_last_layer)
    params = _params()
    objective = objective_lib.Pretraining(BertForPreTraining(cfg), LENGTH, PREDICTIONS)
    instances = _instances(seed=1)

    def loss_and_grads(batch):
        batch = jax.tree.map(jnp.asarray, batch)

        def loss(params):
            sums = objective.sums(params, batch, None)
            return objective.loss(sums, objective.normalizers(batch)), sums

        return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

    (loss, sums), grads = loss_and_grads(_packed(instances))
    (ref_loss, ref_sums), ref_grads = loss_and_grads(_unpacked(instances))
    assert float(sums["nsp_weight_sum"]) == float(ref_sums["nsp_weight_sum"]) == len(LENGTHS)
    assert float(sums["mlm_weight_sum"]) == float(ref_sums["mlm_weight_sum"])
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    for key in ("mlm_loss_sum", "mlm_correct_sum", "nsp_loss_sum", "nsp_correct_sum"):
        np.testing.assert_allclose(sums[key], ref_sums[key], rtol=1e-5, atol=1e-6, err_msg=key)
    flat, ref_flat = jax.tree.leaves_with_path(grads), jax.tree.leaves(ref_grads)
    # float32 sums in another order: up to 5.5e-5 of a tensor's largest entry on an AMD EPYC
    # (XLA:CPU's code differs by CPU); letting a row's instances see each other moves them by up to
    # 65% of it.
    for (path, grad), ref in zip(flat, ref_flat, strict=True):
        scale = max(float(np.abs(ref).max()), 1e-6)
        np.testing.assert_allclose(grad, ref, rtol=0, atol=1e-4 * scale,
                                   err_msg=jax.tree_util.keystr(path))  # fmt: skip


def test_the_step_counts_instances_and_real_tokens():
    """The train step's ``instances_sum``/``tokens_sum`` (the log's seq/s, tok/s and per-step
    counts): a packed batch's real instances and tokens equal the unpacked batch's."""
    instances = _instances()
    for batch in (_packed(instances), _unpacked(instances)):
        counts = step_lib.batch_counts(jax.tree.map(jnp.asarray, batch))
        assert float(counts["instances_sum"]) == len(LENGTHS)
        assert float(counts["tokens_sum"]) == sum(LENGTHS)


def _random_packed_batch(rows, seed=0):
    """``rows`` packed rows of 1-3 random instances (lengths 5-12), each with 1-4 predictions."""
    rng = np.random.default_rng(seed)
    lengths, packs = [], []
    for _ in range(rows):
        count = int(rng.integers(1, K + 1))
        packs.append(tuple(range(len(lengths), len(lengths) + count)))
        lengths += rng.integers(5, 13, count).tolist()
    return _packed(_instances(seed, tuple(lengths)), tuple(packs))


def test_a_packed_step_under_a_mesh_with_the_fused_kernel_equals_xla(impl="fused"):
    """Two sharded train steps on a (2, 2, 2) mesh of packed batches, attention dropout on: the
    Pallas TPU kernel (interpret mode) as the model dispatches it per (batch, heads) shard, with
    sequence ids and block ranges, gives XLA's losses and params. (The GPU kernel's packed rows
    under a mesh: tests/model/attention/common_test.py.)"""
    from bertjax.training import sharding as sh  # noqa: PLC0415
    from configs import base  # noqa: PLC0415

    results = {}
    for ask in ("xla", impl):
        config = base.get_config()
        config.model.update(dict(vocab_size=40, hidden_size=16, num_layers=2, num_heads=4,
                                 intermediate_size=32, max_position_embeddings=LENGTH,
                                 attention_impl=ask))  # fmt: skip
        config.data.update(dict(max_seq_length=LENGTH, max_predictions_per_seq=K * PREDICTIONS,
                                pack_sequences=True, max_sequences_per_pack=K))  # fmt: skip
        config.train.global_batch_size = 8
        config.optimizer.update(dict(learning_rate=1e-2, warmup_steps=1))
        mesh = sh.create_mesh((2, 2, 2))
        trainer = objective_lib.build_steps(config, mesh).trainer
        state = trainer.init_state(jax.random.key(0))
        losses = []
        for seed in range(2):
            batch = sh.make_global_batch(_random_packed_batch(8, seed), mesh)
            state, metrics = trainer.train_step(state, batch, jax.random.key(1))
            losses.append(float(metrics["loss_sum"]))
        results[ask] = losses, jax.tree.map(np.asarray, jax.device_get(state.params))
    np.testing.assert_allclose(results[impl][0], results["xla"][0], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 results[impl][1], results["xla"][1])  # fmt: skip
