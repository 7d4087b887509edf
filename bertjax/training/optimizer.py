"""Optimizers and learning-rate schedules (optax), as configured by ``config.optimizer``.

``config.optimizer`` keys (defaults in ``configs/base.py``):

    name            "bert_adamw" | "adamw" | "lamb"
                    bert_adamw: google-research/bert's AdamWeightDecayOptimizer exactly: Adam
                    moments *without bias correction*, decoupled weight decay added to the update
                    before scaling by the learning rate. adamw: optax.adamw (bias-corrected).
                    lamb: optax.lamb (the large-batch optimizer of NVIDIA's / MLPerf's recipes).
    learning_rate   peak learning rate (after warmup)
    warmup_steps    linear warmup from 0 over this many updates
    schedule        "linear": warmup, then linear decay to 0 at num_train_steps (BERT's
                    polynomial_decay with power 1); "constant": warmup, then constant
    beta1, beta2, eps          Adam / LAMB moment parameters
    weight_decay    decoupled weight decay rate; never applied to LayerNorm params or biases
    max_grad_norm   clip gradients by global norm before the optimizer (<= 0 disables)

The schedule is evaluated at the 0-based update count *before* it is incremented, like the
original code's ``global_step``, so the first update of a warmup run uses learning rate 0.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

OPTIMIZERS = ("bert_adamw", "adamw", "lamb")
SCHEDULES = ("linear", "constant")


def learning_rate_schedule(opt_config, num_train_steps: int) -> optax.Schedule:
    """Step (0-based update count) -> learning rate, per ``opt_config.schedule``."""
    if opt_config.schedule not in SCHEDULES:
        raise ValueError(
            f"config.optimizer.schedule={opt_config.schedule!r}: expected one of {SCHEDULES}"
        )
    peak = float(opt_config.learning_rate)
    warmup = int(opt_config.warmup_steps)
    total = max(int(num_train_steps), 1)
    if warmup < 0:
        raise ValueError(f"config.optimizer.warmup_steps={warmup}: expected >= 0")

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        if opt_config.schedule == "linear":
            # polynomial_decay(peak, step, total, end=0, power=1): clamps at total.
            decayed = peak * (1.0 - jnp.minimum(step, total) / total)
        else:
            decayed = jnp.full_like(step, peak)
        if warmup == 0:
            return decayed
        return jnp.where(step < warmup, peak * step / warmup, decayed)

    return schedule


def decay_mask(params):
    """True for params that get weight decay: not LayerNorm params, not biases.

    Mirrors the original ``_do_use_weight_decay`` exclusions ("LayerNorm", "layer_norm", "bias"),
    matched on this code base's parameter names (``*layer_norm*/{scale,bias}``, ``*bias``).
    """

    def keep(path, _):
        names = [str(getattr(p, "key", getattr(p, "name", p))) for p in path]
        if any("layer_norm" in n.lower() or "layernorm" in n.lower() for n in names):
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


def create_optimizer(opt_config, num_train_steps: int) -> optax.GradientTransformation:
    """The optax transformation for ``opt_config`` (see the module docstring for the keys)."""
    if opt_config.name not in OPTIMIZERS:
        raise ValueError(f"config.optimizer.name={opt_config.name!r}: expected one of {OPTIMIZERS}")
    schedule = learning_rate_schedule(opt_config, num_train_steps)
    b1, b2, eps = float(opt_config.beta1), float(opt_config.beta2), float(opt_config.eps)
    wd = float(opt_config.weight_decay)
    if opt_config.name == "bert_adamw":
        core = optax.chain(
            scale_by_bert_adam(b1, b2, eps),
            optax.add_decayed_weights(wd, mask=decay_mask),
            optax.scale_by_learning_rate(schedule),
        )
    elif opt_config.name == "adamw":
        core = optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=wd, mask=decay_mask)
    else:
        core = optax.lamb(schedule, b1=b1, b2=b2, eps=eps, weight_decay=wd, mask=decay_mask)
    if float(opt_config.max_grad_norm) > 0:
        return optax.chain(optax.clip_by_global_norm(float(opt_config.max_grad_norm)), core)
    return core
