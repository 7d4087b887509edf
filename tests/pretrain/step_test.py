"""Sharded train step: mesh equivalence, gradient accumulation, AOT compile of LARGE, NaN policy."""

import functools
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.pretrain import inputs
from bertjax.pretrain import objective as objective_lib
from bertjax.training import sharding as sh

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "configs"))
import base as base_config  # noqa: E402

LENGTH, PREDICTIONS, BATCH = 16, 4, 16
# The tests' BERT (main_test trains the same one through the CLI): 2 layers, hidden 32, MLP 64,
# so a (2, 2, 2) mesh splits every kernel and a train step compiles in seconds.
TINY_MODEL = dict(
    hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=32
)
RNG = np.asarray(jax.random.key_data(jax.random.key(1)))
pytestmark = pytest.mark.xdist_group("train_test")  # one single-device reference (conftest)


def tiny_config(**train_overrides):
    config = base_config.get_config()
    config.model.update(dict(TINY_MODEL, vocab_size=128))
    config.data.max_seq_length = LENGTH
    config.data.max_predictions_per_seq = PREDICTIONS
    config.train.update(
        dict(
            num_steps=3,
            global_batch_size=BATCH,
            synthetic_data=True,
            log_every=1,
            eval_every=0,
            **train_overrides,
        )
    )
    # No dropout: micro-batches of gradient accumulation would draw other masks than the whole
    # batch, and every test here compares against the same single-device reference.
    config.model.hidden_dropout_rate = config.model.attention_dropout_rate = 0.0
    config.optimizer.update(dict(learning_rate=1e-2, warmup_steps=1))
    return config


def tiny_batches():
    """Synthetic batches; every third row has only 2 of 4 masked positions, so the global MLM
    denominator matters for gradient accumulation."""
    for batch in inputs.synthetic_batches(128, BATCH, LENGTH, PREDICTIONS, 0, 0):
        batch["masked_lm_weights"][::3, 2:] = 0.0
        yield batch


def run_steps(config, devices, mesh_shape):
    """Trains ``config.train.num_steps`` on ``devices`` -> (losses, numpy params, state,
    step_fn, mesh), with what ``bertjax.main`` builds (``objective.build_steps``)."""
    mesh = sh.create_mesh(mesh_shape, devices)
    trainer = objective_lib.build_steps(config, mesh).trainer
    state = trainer.init_state(jax.random.key(0))
    batches = tiny_batches()
    losses = []
    for _ in range(config.train.num_steps):
        state, metrics = trainer.train_step(state, sh.make_global_batch(next(batches), mesh), RNG)
        losses.append(float(metrics["loss_sum"]))
    params = jax.tree.map(np.asarray, jax.device_get(state.params))
    return np.array(losses), params, state, trainer.train_step, mesh


@functools.cache
def single_device_reference():
    losses, params, *_ = run_steps(tiny_config(), jax.devices()[:1], (1, 1, 1))
    return losses, params


def assert_same_training(losses, params):
    ref_losses, ref_params = single_device_reference()
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), params, ref_params
    )
    assert ref_losses[-1] < ref_losses[0]  # it trains


# Each mesh compiles its own step, so the options ride along instead of costing a compile each:
# skip_nonfinite must not change training, and gradient accumulation (2 micro-batches of 8 rows,
# each split over the 8 batch shards) must give the unaccumulated batch's update.
MESHES = {
    (8, 1, 1): dict(skip_nonfinite=True),
    (2, 4, 1): dict(grad_accum_steps=2),
    (2, 2, 2): dict(),
}


@pytest.mark.parametrize("mesh_shape", list(MESHES))
def test_meshes_match_single_device(mesh_shape):
    config = tiny_config(**MESHES[mesh_shape])
    losses, params, state, step_fn, mesh = run_steps(config, jax.devices(), mesh_shape)
    assert_same_training(losses, params)
    if mesh_shape == (2, 2, 2):  # weights really are split over fsdp/tensor, not replicated
        kernel = state.params["encoder"]["layers"]["layer_0"]["intermediate"]["kernel"]
        assert kernel.sharding.shard_shape(kernel.shape) == (16, 32)
    if mesh_shape == (8, 1, 1):
        # A NaN poisons loss and gradients: with skip_nonfinite the step must leave params and
        # optimizer untouched.
        batch = next(tiny_batches())
        batch["masked_lm_weights"][0, 0] = np.nan
        before = jax.device_get((state.params, state.opt_state))
        state, metrics = step_fn(state, sh.make_global_batch(batch, mesh), RNG)
        assert float(metrics["nonfinite"]) == 1.0 and not np.isfinite(float(metrics["loss_sum"]))
        assert int(state.nonfinite_skips) == 1 and int(state.step) == 4
        jax.tree.map(
            np.testing.assert_array_equal, jax.device_get((state.params, state.opt_state)), before
        )


def test_gathered_last_layer_step_equals_the_full_last_layer():
    """The default step runs the last layer only at [CLS] and the masked positions
    (``model.gather_last_layer``); with it off the last layer runs at every position. Three real
    steps of each give the same losses and params. No dropout (tiny_config): a gathered row draws
    its dropout mask from its row of the [B, 1 + P, ...] array, not of [B, L, ...], so with dropout
    the two differ in their masks, not in distribution."""
    reference_config = objective_lib.bert_config_from(tiny_config())
    assert reference_config.gather_last_layer and not reference_config.scan_layers
    config = tiny_config()
    config.model.gather_last_layer = False
    losses, params, *_ = run_steps(config, jax.devices()[:1], (1, 1, 1))
    assert_same_training(losses, params)


def test_large_config_train_step_compiles_on_a_fake_mesh():
    """AOT: shapes only, no params allocated; scan + remat + bf16 on an FSDP x tensor mesh."""
    import large  # noqa: PLC0415

    config = large.get_config()
    config.model.update(scan_layers=True, remat_policy="dots", dtype="bfloat16")
    trainer = objective_lib.build_steps(config, sh.create_mesh((2, 2, 2))).trainer
    abstract = trainer.abstract_state
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32)
    compiled = trainer.train_step.lower(abstract, trainer.train_batch, rng).compile()
    assert compiled is not None
    params = abstract.params["encoder"]["layers"]["layer"]["intermediate"]["kernel"]
    assert params.shape == (24, 1024, 4096)  # BERT-LARGE, stacked for scan


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("train.global_batch_size", 12, "not divisible by 8 data shards"),
        ("data.max_seq_length", 64, "exceeds config.model.max_position_embeddings=32"),
        ("train.grad_accum_steps", 3, "not divisible by config.train.grad_accum_steps=3"),
    ],
)
def test_config_errors_before_compiling(field, value, message):
    config = tiny_config()
    section, key = field.split(".")
    config[section][key] = value
    mesh = sh.create_mesh((8, 1, 1))
    with pytest.raises(ValueError, match=message):
        inputs.check_config(config, objective_lib.bert_config_from(config), mesh, 1)


def test_batch_shape_mismatch_is_reported():
    config = tiny_config()
    batch = next(inputs.synthetic_batches(128, BATCH, LENGTH, PREDICTIONS + 1, 0, 0))
    with pytest.raises(ValueError, match="masked_lm_positions has shape"):
        inputs.check_batch(batch, config, BATCH)


def test_batch_keys_are_the_original_bert_features_and_need_no_tensorflow():
    # The step's batch keys are the original run_pretraining.py feature names (the batch
    # contract), taken from the data pipeline without making the step's module import TensorFlow.
    original = ("input_ids", "segment_ids", "input_mask", "masked_lm_positions", "masked_lm_ids",
                "masked_lm_weights", "next_sentence_labels")  # fmt: skip
    assert objective_lib.BATCH_KEYS == original
    script = "import sys, bertjax.pretrain.objective; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


def dropout_config(attention_impl):
    config = tiny_config()
    config.train.num_steps = 2
    config.model.attention_dropout_rate = config.model.hidden_dropout_rate = 0.1
    config.model.attention_impl = attention_impl
    return config


@functools.cache
def dropout_run_on_2x2x2(attention_impl):
    """(losses, params) of 2 steps with dropout on the (2, 2, 2) mesh: the XLA run is the
    reference of both kernels' cases, run once."""
    losses, params, *_ = run_steps(dropout_config(attention_impl), jax.devices(), (2, 2, 2))
    return losses, params


@pytest.mark.parametrize("impl,kernel", [("fused", "tpu_interpret"), ("gpu_interpret",) * 2])
def test_fused_attention_step_equals_xla_step_with_dropout(impl, kernel):
    """The whole sharded BERT step with attention_impl='fused' (on CPU: the Pallas TPU flash
    kernel in interpret mode), or the Pallas GPU kernel as GPUs run it for calls with dropout,
    equals it with 'xla', the paper's attention dropout on: the kernel draws the same
    counter-hash mask from global positions on every (batch, heads) shard, the last layer's
    gathered queries included. build_steps resolves the ask into that kernel."""
    results = {"xla": dropout_run_on_2x2x2("xla"), impl: dropout_run_on_2x2x2(impl)}
    config = dropout_config(impl)
    np.testing.assert_allclose(results[impl][0], results["xla"][0], rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        results[impl][1],
        results["xla"][1],
    )
    steps = objective_lib.build_steps(config, sh.create_mesh((2, 2, 2)))
    model_config = steps.trainer.objective.model.config
    assert steps.bert_config.attention_impl == model_config.attention_impl == kernel
    assert model_config.cpu_forms  # a CPU mesh: the XLA:CPU forms
