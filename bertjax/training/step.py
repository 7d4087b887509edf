"""The trainer core's pure step, shared by pretraining and fine-tuning.

Step contract::

    train_step(state, batch, rng) -> (state, metrics)

* pure; jitted once with in/out shardings and ``donate_argnums=(0,)``
  (``bertjax.training.compiled``);
* the dropout key of update ``s`` is ``fold_in(rng, s)``, that of micro-batch ``a`` of it
  ``fold_in(fold_in(rng, s), a)``;
* ``metrics`` are sums and counts, divided on the host (``bertjax.training.metrics``): the
  objective's sums plus ``loss_sum`` (this update's loss), ``steps`` (1), ``grad_norm_sum``,
  ``learning_rate`` (the rate this update used), ``nonfinite`` (1 for a NaN/Inf loss or
  gradient norm), ``instances_sum`` (the batch's instances: a packed batch's
  largest ``sequence_ids`` per row summed, else its rows) and ``tokens_sum`` (its real tokens:
  ``input_mask`` != 0), so the log counts what was learned from, not the slots computed.

What differs between pretraining and fine-tuning is an :class:`Objective`: the model and its
init, the batch's global normalisers, the per-(micro)batch sums and the loss made of them.

**Gradient accumulation** splits the global batch into ``grad_accum_steps`` micro-batches (row
``r`` of micro-batch ``a`` is row ``r * A + a``, so each keeps the batch's data-parallel layout)
and sums the gradients of ``objective.loss(micro sums, global normalisers)``. Every loss here is
a sum over examples divided by a count over the whole batch, so the update equals the
unaccumulated one.

**Non-finite guard**: with ``skip_nonfinite`` the step keeps the old params and optimizer state
on a NaN/Inf loss or gradient norm and counts a skip (the update still consumes its batch);
without it (which saves a select over the whole state every step) the host loop stops on the
``nonfinite`` flag before anything is written (``bertjax.training.loop``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import flax
import jax
import jax.numpy as jnp
import optax
from flax import linen as nn


class TrainState(flax.struct.PyTreeNode):
    step: jax.Array  # <int32>[] number of updates applied
    params: Any
    opt_state: Any
    nonfinite_skips: jax.Array  # <int32>[] updates skipped because of NaN/Inf


class Objective(Protocol):
    """What a training run optimises: pretraining's MLM + NSP, or a fine-tuning task's head."""

    model: nn.Module

    def init(self, rng: jax.Array) -> Any:
        """Fresh (boxed, logically annotated) params, from dummy inputs of batch 1."""

    def normalizers(self, batch: dict) -> dict[str, jax.Array]:
        """Counts over the whole global batch that the loss divides by."""

    def sums(self, params, batch: dict, dropout_rng: jax.Array | None) -> dict[str, jax.Array]:
        """Loss and metric sums of a (micro-)batch; ``dropout_rng`` None = deterministic."""

    def loss(self, sums: dict, normalizers: dict) -> jax.Array:
        """<float32>[] the loss to minimise, from sums over (a part of) the batch."""


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """The run config's scalars the step needs (hashable; bound with functools.partial)."""

    grad_accum_steps: int = 1
    skip_nonfinite: bool = False  # keep the old state on a non-finite step (else the loop stops)


def _split_micro(batch, num_micro: int):
    """<..>[B, ...] -> <..>[A, B/A, ...] (module docstring)."""

    def split(x):
        x = x.reshape(x.shape[0] // num_micro, num_micro, *x.shape[1:])
        return jnp.swapaxes(x, 0, 1)

    return jax.tree.map(split, batch)


def loss_and_grads(objective: Objective, params, batch, rng, grad_accum_steps: int):
    """(sums, grads) of the global batch's loss, accumulated over micro-batches."""
    normalizers = objective.normalizers(batch)

    def micro_loss(params, micro, micro_rng):
        sums = objective.sums(params, micro, micro_rng)
        return objective.loss(sums, normalizers), sums

    grad_fn = jax.grad(micro_loss, has_aux=True)
    if grad_accum_steps == 1:
        grads, sums = grad_fn(params, batch, rng)
        return sums, grads

    def body(carry, xs):
        index, micro = xs
        grads, sums = grad_fn(params, micro, jax.random.fold_in(rng, index))
        return jax.tree.map(jnp.add, carry, (sums, grads)), None

    micro = _split_micro(batch, grad_accum_steps)
    first = jax.tree.map(lambda x: x[0], micro)
    zero_sums = jax.eval_shape(lambda: objective.sums(params, first, rng))
    init = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (zero_sums, params))
    (sums, grads), _ = jax.lax.scan(body, init, (jnp.arange(grad_accum_steps), micro))
    return sums, grads


def train_step(
    state: TrainState, batch, rng, *, objective: Objective, tx, schedule, step_config: StepConfig
) -> tuple[TrainState, dict]:
    """One optimizer update on the global batch. Pure; see the module docstring."""
    step_rng = jax.random.fold_in(rng, state.step)
    sums, grads = loss_and_grads(
        objective, state.params, batch, step_rng, step_config.grad_accum_steps
    )
    loss = objective.loss(sums, objective.normalizers(batch))
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    if step_config.skip_nonfinite:
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
        params, opt_state = keep(params, state.params), keep(opt_state, state.opt_state)
    new_state = TrainState(
        step=state.step + 1,  # a skipped update still consumes its batch
        params=params,
        opt_state=opt_state,
        nonfinite_skips=state.nonfinite_skips + (1 - finite.astype(jnp.int32)),
    )
    metrics = dict(
        sums,
        loss_sum=loss,
        steps=jnp.ones((), jnp.float32),
        grad_norm_sum=grad_norm,
        learning_rate=schedule(state.step),
        nonfinite=1.0 - finite.astype(jnp.float32),
        **batch_counts(batch),
    )
    return new_state, metrics


def batch_counts(batch) -> dict:
    """``instances_sum`` and ``tokens_sum`` of a global batch (the module docstring)."""
    if "sequence_ids" in batch:  # packed rows (pretraining's and fine-tuning's): ids 1..k
        instances = jnp.sum(jnp.max(batch["sequence_ids"], axis=-1).astype(jnp.float32))
    else:
        instances = jnp.asarray(batch["input_mask"].shape[0], jnp.float32)
    tokens = jnp.sum((batch["input_mask"] != 0).astype(jnp.float32))
    return {"instances_sum": instances, "tokens_sum": tokens}


def eval_sums(params, batch, *, objective: Objective) -> dict:
    """The objective's deterministic sums on one global batch (pad rows carry zero weights)."""
    return objective.sums(params, batch, None)
