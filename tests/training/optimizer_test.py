"""bertjax.training.optimizer vs a numpy transcription of google-research/bert's optimization.py."""

import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from bertjax.training import optimizer


def _opt_config(**overrides):
    c = ml_collections.ConfigDict(
        dict(
            name="bert_adamw",
            learning_rate=1e-2,
            warmup_steps=3,
            schedule="linear",
            decay_steps=0,
            beta1=0.9,
            beta2=0.999,
            eps=1e-6,
            weight_decay=0.01,
            max_grad_norm=1.0,
        )
    )
    c.update(overrides)
    return c


def _reference_bert_adamw(params, grads_per_step, lr, warmup, total, wd, clip):
    """numpy transcription of create_optimizer + AdamWeightDecayOptimizer.apply_gradients."""
    exclude = ["LayerNorm", "layer_norm", "bias"]
    names = list(params)
    p = {k: v.astype(np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v_ = {k: np.zeros_like(v) for k, v in p.items()}
    for global_step, grads in enumerate(grads_per_step):
        # polynomial_decay(end=0, power=1), then the warmup override, at the pre-increment step.
        learning_rate = lr * (1.0 - min(global_step, total) / total)
        if global_step < warmup:
            learning_rate = lr * global_step / warmup
        g = {k: grads[k].astype(np.float64) for k in names}
        norm = np.sqrt(sum(np.sum(x**2) for x in g.values()))
        g = {k: x * clip / max(norm, clip) for k, x in g.items()}
        for k in names:
            m[k] = 0.9 * m[k] + 0.1 * g[k]
            v_[k] = 0.999 * v_[k] + 0.001 * g[k] ** 2
            update = m[k] / (np.sqrt(v_[k]) + 1e-6)
            if not any(re.search(r, k) for r in exclude):
                update += wd * p[k]
            p[k] = p[k] - learning_rate * update
    return p


def _flat_params(rng):
    shapes = {
        "encoder/dense/kernel": (4, 3),
        "encoder/dense/bias": (3,),
        "encoder/attention_layer_norm/scale": (3,),
        "mlm/output_bias": (5,),
        "encoder/embeddings/word_embeddings/embedding": (5, 3),
    }
    return {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}


def _nest(flat):
    out = {}
    for k, v in flat.items():
        node = out
        *parents, leaf = k.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return out


def test_bert_adamw_matches_numpy_transcription():
    rng = np.random.default_rng(0)
    flat = _flat_params(rng)
    steps = 8
    # Large gradients on some steps so clipping is active.
    grads = [
        {
            k: (rng.normal(size=v.shape) * (3.0 if s % 2 else 0.1)).astype(np.float32)
            for k, v in flat.items()
        }
        for s in range(steps)
    ]
    tx = optimizer.create_optimizer(_opt_config(), num_train_steps=10)
    params = jax.tree.map(jnp.asarray, _nest(flat))
    state = tx.init(params)
    # Jitted as a train step runs it (and one compile costs less than 8 steps op by op).
    update, apply_updates = jax.jit(tx.update), jax.jit(optax.apply_updates)
    for g in grads:
        updates, state = update(jax.tree.map(jnp.asarray, _nest(g)), state, params)
        params = apply_updates(params, updates)
    ref = _nest(_reference_bert_adamw(flat, grads, 1e-2, 3, 10, 0.01, 1.0))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-7), params, ref)


def test_decay_mask_excludes_layer_norm_and_biases():
    mask = optimizer.decay_mask(_nest(_flat_params(np.random.default_rng(0))))
    assert mask["encoder"]["dense"]["kernel"]
    assert mask["encoder"]["embeddings"]["word_embeddings"]["embedding"]
    assert not mask["encoder"]["dense"]["bias"]
    assert not mask["encoder"]["attention_layer_norm"]["scale"]
    assert not mask["mlm"]["output_bias"]


def test_schedule_warmup_then_linear_decay_to_zero():
    sched = optimizer.learning_rate_schedule(_opt_config(learning_rate=1.0, warmup_steps=10), 100)
    got = np.array([sched(s) for s in (0, 5, 10, 55, 100, 150)])
    np.testing.assert_allclose(got, [0.0, 0.5, 0.9, 0.45, 0.0, 0.0], atol=1e-6)
    const = optimizer.learning_rate_schedule(
        _opt_config(learning_rate=2.0, warmup_steps=0, schedule="constant"), 100
    )
    assert float(const(70)) == 2.0


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_other_optimizers_build_and_respect_the_mask(name):
    params = _nest(_flat_params(np.random.default_rng(1)))
    zero_grads = jax.tree.map(np.zeros_like, params)
    tx = optimizer.create_optimizer(_opt_config(name=name, warmup_steps=0, weight_decay=0.5), 10)
    updates, _ = jax.jit(tx.update)(zero_grads, tx.init(params), params)  # one compile
    # With zero gradients only weight decay moves params: excluded leaves must not move.
    assert np.all(np.asarray(updates["encoder"]["dense"]["bias"]) == 0)
    assert np.all(np.asarray(updates["encoder"]["attention_layer_norm"]["scale"]) == 0)
    assert np.any(np.asarray(updates["encoder"]["dense"]["kernel"]) != 0)


def test_bad_names_raise_clear_errors():
    with pytest.raises(ValueError, match="config.optimizer.name"):
        optimizer.create_optimizer(_opt_config(name="sgd"), 10)
    with pytest.raises(ValueError, match="config.optimizer.schedule"):
        optimizer.create_optimizer(_opt_config(schedule="cosine"), 10)


@pytest.mark.parametrize("fully_decoupled", [False, True])
def test_stable_adamw_equals_modernberts_optimi_step_for_step(fully_decoupled):
    """optimizer.name='stable_adamw' against torch-optimi's StableAdamW (ModernBERT's optimizer;
    for-loop implementation, float32 on CPU) over 6 steps: weight decay on kernels only, a
    gradient 30x larger at step 4 so that the per-tensor update clipping acts, gradient
    clipping off; the decay scaled by lr_t or, fully decoupled, by lr_t / peak (ModernBERT's).
    Same params within float32 rounding; a control without the clipping differs."""
    import optimi  # noqa: PLC0415
    import torch  # noqa: PLC0415

    rng = np.random.default_rng(3)
    flat = _flat_params(rng)
    decay = 5e-4 if fully_decoupled else 0.05  # either way, params shrink by 5e-4 a step
    grads = [{k: (rng.normal(size=v.shape) * (30.0 if s == 3 else 1.0)).astype(np.float32)
              for k, v in flat.items()} for s in range(6)]  # fmt: skip
    config = dict(name="stable_adamw", learning_rate=1e-2, warmup_steps=0, schedule="constant",
                  beta1=0.9, beta2=0.99, eps=1e-6, weight_decay=decay, max_grad_norm=0.0,
                  fully_decoupled_decay=fully_decoupled)  # fmt: skip
    tx = optimizer.create_optimizer(_opt_config(**config), 10)
    params = jax.tree.map(jnp.asarray, _nest(flat))
    state = tx.init(params)
    # Jitted as a train step runs it (and one compile costs less than 8 steps op by op).
    update, apply_updates = jax.jit(tx.update), jax.jit(optax.apply_updates)
    for g in grads:
        updates, state = update(jax.tree.map(jnp.asarray, _nest(g)), state, params)
        params = apply_updates(params, updates)

    mask = optimizer.decay_mask(_nest(flat))
    decays = {k: bool(_get(mask, k)) for k in flat}
    tensors = {k: torch.tensor(v, requires_grad=True) for k, v in flat.items()}
    groups = [{"params": [tensors[k] for k in flat if decays[k] == d], "weight_decay": wd}
              for d, wd in ((True, decay), (False, 0.0))]  # fmt: skip
    reference = optimi.StableAdamW(groups, lr=1e-2, betas=(0.9, 0.99), eps=1e-6,
                                   decouple_lr=fully_decoupled, max_lr=1e-2,
                                   foreach=False, triton=False)  # fmt: skip
    for g in grads:
        for k, t in tensors.items():
            t.grad = torch.tensor(g[k])
        reference.step()
    assert any(not d for d in decays.values()) and any(decays.values())
    for k, t in tensors.items():
        np.testing.assert_allclose(_get(params, k), t.detach().numpy(), rtol=2e-6, atol=1e-7,
                                   err_msg=k)  # fmt: skip
    # The control: plain AdamW (bias-corrected, the same decay) misses the step-4 clipping.
    if fully_decoupled:
        return
    plain = optimizer.create_optimizer(_opt_config(**{**config, "name": "adamw"}), 10)
    control, plain_state = jax.tree.map(jnp.asarray, _nest(flat)), None
    plain_state = plain.init(control)
    for g in grads:
        updates, plain_state = plain.update(jax.tree.map(jnp.asarray, _nest(g)), plain_state,
                                            control)  # fmt: skip
        control = optax.apply_updates(control, updates)
    kernel = "encoder/dense/kernel"
    assert np.abs(_get(control, kernel) - _get(params, kernel)).max() > 1e-4


def _get(tree, path):
    for key in path.split("/"):
        tree = tree[key]
    return np.asarray(tree)


@pytest.mark.parametrize("shape", ["linear", "1-sqrt"])
def test_wsd_schedule_warms_up_holds_then_cools_down_to_zero(shape):
    """100 steps: 10 of warmup, constant to step 80, then 20 of cooldown to 0 at step 100."""
    config = _opt_config(learning_rate=1.0, warmup_steps=10, schedule="wsd", cooldown_steps=20,
                         cooldown_shape=shape)  # fmt: skip
    sched = optimizer.learning_rate_schedule(config, 100)
    got = np.array([float(sched(s)) for s in (0, 5, 10, 50, 80, 85, 95, 100, 120)])
    fraction = np.array([5, 15]) / 20
    cooled = 1 - (np.sqrt(fraction) if shape == "1-sqrt" else fraction)
    np.testing.assert_allclose(got, [0, 0.5, 1, 1, 1, *cooled, 0, 0], atol=1e-6)


def test_wsd_and_stable_adamw_bad_keys_are_one_line_errors():
    with pytest.raises(ValueError, match=r"cooldown_shape='cosine': expected one of"):
        optimizer.learning_rate_schedule(
            _opt_config(schedule="wsd", cooldown_steps=5, cooldown_shape="cosine"), 100
        )
    with pytest.raises(ValueError, match=r"cooldown_steps=98: expected 0..97 \(the schedule's"):
        optimizer.learning_rate_schedule(
            _opt_config(schedule="wsd", cooldown_steps=98, cooldown_shape="linear"), 100
        )


def test_decay_mask_excludes_modernbert_norms():
    params = {"encoder": {"final_norm": {"scale": 1}, "layers": {"layer_1": {
        "attention_norm": {"scale": 1}, "mlp_norm": {"scale": 1},
        "intermediate": {"kernel": 1}}}}}  # fmt: skip
    mask = optimizer.decay_mask(params)
    layer = mask["encoder"]["layers"]["layer_1"]
    assert layer["intermediate"]["kernel"]
    assert not (layer["attention_norm"]["scale"] or layer["mlp_norm"]["scale"])
    assert not mask["encoder"]["final_norm"]["scale"]
