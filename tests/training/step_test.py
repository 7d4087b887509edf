"""The trainer core's step (``bertjax.training.step``): what every run's update rests on.

References: the loss counted by hand in numpy from the model's own logits (the model itself is
checked against HF PyTorch in tests/model/); the unaccumulated batch for gradient accumulation;
the unrolled layers for ``scan_layers``; no rematerialisation for every remat policy.
"""

import copy
import functools

import jax
import numpy as np
import pytest

from bertjax.finetune import objective as finetune_objective
from bertjax.model.config import REMAT_POLICIES, BertConfig
from bertjax.model.encoder import stack_layers, unstack_layers
from bertjax.model.heads import BertForTokenClassification
from bertjax.pretrain import objective as pretrain_objective
from bertjax.training import compiled, optimizer
from bertjax.training import sharding as sh
from bertjax.training import step as step_lib
from bertjax.training.step import StepConfig
from tests.pretrain.step_test import RNG, tiny_batches, tiny_config


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _nll(logits, labels):
    return -np.take_along_axis(_log_softmax(np.asarray(logits, np.float64)), labels[..., None], -1)[
        ..., 0
    ]


def _one_device():
    return sh.create_mesh((1, 1, 1), jax.devices()[:1])


def _pretraining(config, mesh=None):
    return pretrain_objective.build_steps(config, mesh or _one_device()).trainer


@pytest.mark.parametrize("grad_accum_steps", [1, 4])
def test_pretraining_loss_is_normalised_by_hand_counted_global_denominators(grad_accum_steps):
    """loss = sum of MLM NLL over the weighted masked positions / their number in the whole
    batch + mean NSP NLL; every third row has 2 of 4 positions masked out (weight 0), so a
    per-micro-batch or per-row mean would differ."""
    trainer = _pretraining(tiny_config(grad_accum_steps=grad_accum_steps))
    state = trainer.init_state(jax.random.key(0))
    batch = next(tiny_batches())
    out = _pretraining_logits(trainer.objective.model, jax.device_get(state.params), batch)
    weights = batch["masked_lm_weights"]
    assert weights.sum() == 16 * 4 - 6 * 2  # 6 rows of 16 with 2 positions masked out
    mlm = (_nll(out.mlm_logits, batch["masked_lm_ids"]) * weights).sum() / weights.sum()
    nsp = _nll(out.nsp_logits, batch["next_sentence_labels"]).mean()
    _, metrics = trainer.train_step(state, sh.make_global_batch(batch, trainer.mesh), RNG)
    np.testing.assert_allclose(float(metrics["loss_sum"]), mlm + nsp, rtol=2e-6)
    assert float(metrics["mlm_weight_sum"]) == weights.sum()


@functools.partial(jax.jit, static_argnums=0)
def _pretraining_logits(model, params, batch):
    """The model's logits, jitted (eagerly each op would compile on its own); one program for
    both cases of the test above (the model is the same)."""
    return model.apply(
        {"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"],
        batch["masked_lm_positions"], deterministic=True,
    )  # fmt: skip


def _tagging_trainer(grad_accum_steps: int):
    cfg = BertConfig(
        vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
        max_position_embeddings=16, hidden_dropout_rate=0.0, attention_dropout_rate=0.0,
    )  # fmt: skip
    objective = finetune_objective.FineTuning(BertForTokenClassification(cfg, 5), "tagging", (12,))
    opt = tiny_config().optimizer
    batch = {
        "input_ids": jax.ShapeDtypeStruct((8, 12), np.int32),
        "segment_ids": jax.ShapeDtypeStruct((8, 12), np.int32),
        "input_mask": jax.ShapeDtypeStruct((8, 12), np.int32),
        "label_ids": jax.ShapeDtypeStruct((8, 12), np.int32),
        "label_weights": jax.ShapeDtypeStruct((8, 12), np.float32),
        "example_weights": jax.ShapeDtypeStruct((8,), np.float32),
    }
    return compiled.build_trainer(
        objective, optimizer.create_optimizer(opt, 10), optimizer.learning_rate_schedule(opt, 10),
        StepConfig(grad_accum_steps=grad_accum_steps), _one_device(), tiny_config().mesh.rules,
        batch,
    )  # fmt: skip


def test_fine_tuning_accumulation_equals_the_big_batch_and_a_hand_count():
    """Tagging: the loss is over labelled first word pieces, whose number differs per row (and
    per micro-batch); 4 micro-batches of 2 rows give the 8-row batch's loss and update."""
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": rng.integers(1, 64, (8, 12)).astype(np.int32),
        "segment_ids": np.zeros((8, 12), np.int32),
        "input_mask": np.ones((8, 12), np.int32),
        "label_ids": rng.integers(0, 5, (8, 12)).astype(np.int32),
        "label_weights": (rng.random((8, 12)) < np.linspace(0.1, 0.9, 8)[:, None]).astype(
            np.float32
        ),
        "example_weights": np.asarray([1, 1, 1, 1, 1, 1, 1, 0], np.float32),  # a padded row
    }
    trainers = {accum: _tagging_trainer(accum) for accum in (1, 4)}
    trainer = trainers[1]
    params = jax.device_get(trainer.init_state(jax.random.key(0)).params)
    grads = {
        accum: jax.jit(
            lambda p, b, accum=accum: step_lib.loss_and_grads(trainer.objective, p, b, RNG, accum)
        )(params, batch)
        for accum in (1, 4)
    }
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), grads[4], grads[1]
    )
    logits = jax.jit(trainer.objective.model.apply)(
        {"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"]
    )
    weights = batch["label_weights"] * batch["example_weights"][:, None]
    want = (_nll(logits, batch["label_ids"]) * weights).sum() / weights.sum()
    for trainer in trainers.values():
        state = trainer.init_state(jax.random.key(0))
        _, metrics = trainer.train_step(state, sh.make_global_batch(batch, trainer.mesh), RNG)
        np.testing.assert_allclose(float(metrics["loss_sum"]), want, rtol=2e-6)


def _train(trainer, params, num_steps=2):
    """``num_steps`` updates from host ``params`` -> (losses, host params)."""
    state = trainer.init_state(jax.random.key(0), params)
    batches, losses = tiny_batches(), []
    for _ in range(num_steps):
        batch = sh.make_global_batch(next(batches), trainer.mesh)
        state, metrics = trainer.train_step(state, batch, RNG)
        losses.append(float(metrics["loss_sum"]))
    return np.asarray(losses), jax.device_get(state.params)


def _assert_same(got, want):
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), *got[1:], *want[1:]
    )


@pytest.fixture(scope="module")
def unrolled():
    """2 updates of the unrolled tiny BERT from fixed params, dropout on: (config, params,
    (losses, params after))."""
    config = tiny_config()
    config.model.hidden_dropout_rate = config.model.attention_dropout_rate = 0.1
    trainer = _pretraining(config)
    params = jax.device_get(trainer.init_state(jax.random.key(0)).params)
    return config, params, _train(trainer, params)


def test_scan_layers_equal_unrolled(unrolled):
    """Dropout off: scanned layers draw their masks per layer from split keys, unrolled ones by
    name, so only the deterministic update can be the same."""
    params = unrolled[1]
    config = tiny_config()
    unrolled_run = _train(_pretraining(config), params)
    config.model.scan_layers = True
    layers = config.model.num_layers
    stacked = {**params, "encoder": stack_layers(params["encoder"], layers)}
    losses, scanned = _train(_pretraining(config), stacked)
    scanned = {**scanned, "encoder": unstack_layers(scanned["encoder"], layers)}
    _assert_same((losses, scanned), unrolled_run)


@pytest.mark.parametrize("policy", [p for p in REMAT_POLICIES if p != "none"])
def test_each_remat_policy_equals_none(unrolled, policy):
    """Dropout on: a rematerialised forward draws the same masks."""
    config, params, want = unrolled
    config = copy.deepcopy(config)
    config.model.remat_policy = policy
    _assert_same(_train(_pretraining(config), params), want)
