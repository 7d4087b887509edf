"""Optimizers and learning-rate schedules (optax), as configured by ``config.optimizer``.

``config.optimizer`` keys (defaults in ``configs/base.py``):

    name            "bert_adamw" | "adamw" | "lamb" | "stable_adamw"
                    bert_adamw: google-research/bert's AdamWeightDecayOptimizer exactly: Adam
                    moments *without bias correction*, decoupled weight decay added to the update
                    before scaling by the learning rate. adamw: optax.adamw (bias-corrected).
                    lamb: optax.lamb (the large-batch optimizer of NVIDIA's / MLPerf's recipes).
                    stable_adamw: StableAdamW (Wortsman et al., 2023; ModernBERT's, as optimi's
                    StableAdamW): AdamW whose learning rate is divided, per tensor, by
                    max(1, sqrt(mean(g^2 / max(v_hat, eps^2)))) (:func:`scale_by_stable_adamw`).
    learning_rate   peak learning rate (after warmup)
    warmup_steps    linear warmup from 0 over this many updates
    schedule        "linear": warmup, then linear decay to 0 at num_train_steps (BERT's
                    polynomial_decay with power 1); "constant": warmup, then constant;
                    "wsd": warmup-stable-decay: warmup, constant, then a cooldown to 0 at
                    num_train_steps over its last ``cooldown_steps``, shaped ``cooldown_shape``
                    ("linear" or "1-sqrt": peak * (1 - sqrt(fraction of the cooldown done)))
    beta1, beta2, eps          Adam / LAMB moment parameters
    weight_decay    decoupled weight decay rate; never applied to norm params or biases
    fully_decoupled_decay   stable_adamw only: the decay follows the schedule's shape but not
                    its peak, param *= 1 - (lr_t / learning_rate) * weight_decay (ModernBERT's
                    ``decoupled_stableadamw``, optimi's ``decouple_lr``); False: * lr_t
    max_grad_norm   clip gradients by global norm before the optimizer (<= 0 disables)

The schedule is evaluated at the 0-based update count *before* it is incremented, like the
original code's ``global_step``, so the first update of a warmup run uses learning rate 0.
With a batch-size warm-up (``bertjax.training.batch_schedule``) the schedule's steps are
full-batch steps (tokens seen / the full batch's tokens), so its warmup and cooldown keep the
tokens they had without one.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

OPTIMIZERS = ("bert_adamw", "adamw", "lamb", "stable_adamw")
SCHEDULES = ("linear", "constant", "wsd")
COOLDOWN_SHAPES = ("linear", "1-sqrt")


def learning_rate_schedule(opt_config, num_train_steps: int, step_map=None) -> optax.Schedule:
    """Step (0-based update count) -> learning rate, per ``opt_config.schedule``. ``step_map``:
    what the schedule's steps are, from the update count (a batch-size warm-up's full-batch
    steps, ``bertjax.training.batch_schedule``); none: the updates themselves."""
    if opt_config.schedule not in SCHEDULES:
        raise ValueError(
            f"config.optimizer.schedule={opt_config.schedule!r}: expected one of {SCHEDULES}"
        )
    peak = float(opt_config.learning_rate)
    warmup = int(opt_config.warmup_steps)
    total = max(int(num_train_steps), 1)
    if warmup < 0:
        raise ValueError(f"config.optimizer.warmup_steps={warmup}: expected >= 0")

    cooldown, shape = _cooldown(opt_config, total, warmup)

    def schedule(step):
        step = jnp.asarray(step if step_map is None else step_map(step), jnp.float32)
        if opt_config.schedule == "linear":
            # polynomial_decay(peak, step, total, end=0, power=1): clamps at total.
            decayed = peak * (1.0 - jnp.minimum(step, total) / total)
        elif opt_config.schedule == "wsd":
            done = jnp.clip((step - (total - cooldown)) / max(cooldown, 1), 0.0, 1.0)
            decayed = peak * (1.0 - (jnp.sqrt(done) if shape == "1-sqrt" else done))
        else:
            decayed = jnp.full_like(step, peak)
        if warmup == 0:
            return decayed
        return jnp.where(step < warmup, peak * step / warmup, decayed)

    return schedule


def _cooldown(opt_config, total: int, warmup: int) -> tuple[int, str]:
    """(cooldown steps, shape) of a "wsd" schedule, checked; (0, "linear") for the others."""
    if opt_config.schedule != "wsd":
        return 0, "linear"
    steps, shape = int(opt_config.cooldown_steps), opt_config.cooldown_shape
    if shape not in COOLDOWN_SHAPES:
        raise ValueError(
            f"config.optimizer.cooldown_shape={shape!r}: expected one of {COOLDOWN_SHAPES}"
        )
    if not 0 <= steps <= total - warmup:
        raise ValueError(
            f"config.optimizer.cooldown_steps={steps}: expected 0..{total - warmup} (the "
            f"schedule's {total} steps less its {warmup} of warmup)"
        )
    return steps, shape


def decay_mask(params):
    """True for params that get weight decay: not norm params, not biases.

    Mirrors the original ``_do_use_weight_decay`` exclusions ("LayerNorm", "layer_norm", "bias"),
    matched on this code base's parameter names (``*layer_norm*/{scale,bias}`` and
    ModernBERT's ``{attention,mlp,final}_norm``: any module named ``*norm``; ``*bias``).
    """

    def keep(path, _):
        names = [str(getattr(p, "key", getattr(p, "name", p))).lower() for p in path]
        if any("layer_norm" in n or "layernorm" in n or n.endswith("norm") for n in names):
            return False
        return not names[-1].endswith("bias")

    return jax.tree_util.tree_map_with_path(keep, params)


class ScaleByBertAdamState(NamedTuple):
    mu: optax.Updates
    nu: optax.Updates


def scale_by_bert_adam(beta1: float, beta2: float, eps: float) -> optax.GradientTransformation:
    """Adam direction m / (sqrt(v) + eps) with *no* bias correction (original BERT)."""

    def init_fn(params):
        zeros = lambda p: jnp.zeros_like(p, dtype=jnp.float32)
        return ScaleByBertAdamState(jax.tree.map(zeros, params), jax.tree.map(zeros, params))

    def update_fn(updates, state, params=None):
        del params
        mu = jax.tree.map(
            lambda m, g: beta1 * m + (1.0 - beta1) * g.astype(jnp.float32), state.mu, updates
        )
        nu = jax.tree.map(
            lambda v, g: beta2 * v + (1.0 - beta2) * jnp.square(g.astype(jnp.float32)),
            state.nu,
            updates,
        )
        direction = jax.tree.map(
            lambda m, v, g: (m / (jnp.sqrt(v) + eps)).astype(g.dtype), mu, nu, updates
        )
        return direction, ScaleByBertAdamState(mu, nu)

    return optax.GradientTransformation(init_fn, update_fn)


class ScaleByStableAdamWState(NamedTuple):
    count: jax.Array
    mu: optax.Updates
    nu: optax.Updates


def scale_by_stable_adamw(
    beta1: float, beta2: float, eps: float, weight_decay: float, mask
) -> optax.GradientTransformation:
    """StableAdamW's update before the learning rate (Wortsman et al., 2023, Algorithm 2):

        m, v = the bias-corrected moments of g (float32)
        r = sqrt(mean over the tensor of g^2 / max(v, eps^2))
        direction = (m / (sqrt(v) + eps) + weight_decay * param) / max(1, r)

    weight decay only where ``mask(params)`` is True. ``optax.scale_by_learning_rate`` after it
    gives optimi's StableAdamW step: ``param *= 1 - lr_t wd; param -= lr_t m / (sqrt(v) + eps)``
    with ``lr_t = lr / max(1, r)``."""

    def init_fn(params):
        zeros = lambda p: jnp.zeros_like(p, dtype=jnp.float32)
        return ScaleByStableAdamWState(
            jnp.zeros([], jnp.int32), jax.tree.map(zeros, params), jax.tree.map(zeros, params)
        )

    def update_fn(updates, state, params=None):
        count = state.count + 1
        g32 = jax.tree.map(lambda g: g.astype(jnp.float32), updates)
        mu = jax.tree.map(lambda m, g: beta1 * m + (1.0 - beta1) * g, state.mu, g32)
        nu = jax.tree.map(lambda v, g: beta2 * v + (1.0 - beta2) * g * g, state.nu, g32)
        t = count.astype(jnp.float32)
        m_scale, v_scale = 1.0 / (1.0 - beta1**t), 1.0 / (1.0 - beta2**t)
        decays = mask(params) if weight_decay else jax.tree.map(lambda _: False, params)

        def direction(m, v, g, p, decay, out):
            m_hat, v_hat = m * m_scale, v * v_scale
            rms = jnp.sqrt(jnp.mean(g * g / jnp.maximum(v_hat, eps * eps)))
            step = m_hat / (jnp.sqrt(v_hat) + eps)
            if decay:
                step = step + weight_decay * p.astype(jnp.float32)
            return (step / jnp.maximum(1.0, rms)).astype(out.dtype)

        directions = jax.tree.map(direction, mu, nu, g32, params, decays, updates)
        return directions, ScaleByStableAdamWState(count, mu, nu)

    return optax.GradientTransformation(init_fn, update_fn)


def create_optimizer(
    opt_config, num_train_steps: int, step_map=None
) -> optax.GradientTransformation:
    """The optax transformation for ``opt_config`` (see the module docstring for the keys);
    ``step_map`` as :func:`learning_rate_schedule`'s."""
    if opt_config.name not in OPTIMIZERS:
        raise ValueError(f"config.optimizer.name={opt_config.name!r}: expected one of {OPTIMIZERS}")
    schedule = learning_rate_schedule(opt_config, num_train_steps, step_map)
    b1, b2, eps = float(opt_config.beta1), float(opt_config.beta2), float(opt_config.eps)
    wd = float(opt_config.weight_decay)
    if opt_config.name == "bert_adamw":
        core = optax.chain(
            scale_by_bert_adam(b1, b2, eps),
            optax.add_decayed_weights(wd, mask=decay_mask),
            optax.scale_by_learning_rate(schedule),
        )
    elif opt_config.name == "stable_adamw":
        peak = float(opt_config.learning_rate)
        if opt_config.get("fully_decoupled_decay", False) and peak > 0:
            wd = wd / peak  # scaled back by lr_t: (lr_t / peak) * weight_decay
        core = optax.chain(
            scale_by_stable_adamw(b1, b2, eps, wd, decay_mask),
            optax.scale_by_learning_rate(schedule),
        )
    elif opt_config.name == "adamw":
        core = optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=wd, mask=decay_mask)
    else:
        core = optax.lamb(schedule, b1=b1, b2=b2, eps=eps, weight_decay=wd, mask=decay_mask)
    if float(opt_config.max_grad_norm) > 0:
        return optax.chain(optax.clip_by_global_norm(float(opt_config.max_grad_norm)), core)
    return core
