"""Pretraining state and steps: the sharded TrainState and the pure train/eval steps, jitted once.

Step contract: ``train_step(state, batch, rng) -> (state, metrics)`` is pure; it is jitted once with
in/out shardings and ``donate_argnums=(0,)``; the per-step dropout key is ``fold_in(rng,
state.step)``; ``metrics`` are sums and counts (divided on the host by
``bertjax.training.metrics``). The state is built abstractly (``jax.eval_shape``), its shardings
come from the params' logical axes and ``config.mesh.rules``, and it is materialised by a jitted
init with ``out_shardings`` so it never lands whole on one device. The batch is the spec of
``bertjax.data.pipeline`` (``BATCH_KEYS``), split over the mesh's data axes.

Gradient accumulation splits the global batch into ``grad_accum_steps`` micro-batches and sums
the gradients of ``sum_loss_i / global_denominator``, so the update equals the unaccumulated one.
Every step returns a ``nonfinite`` flag (NaN/Inf loss or gradient norm). With
``train.skip_nonfinite`` the step itself keeps the old params and optimizer state and counts a
skip; otherwise (the default, which saves a select over the whole state every step) the host
loop stops on the flag before anything is written (``bertjax.pretrain.loop``).

The run around these steps (restore, data, logging, eval, checkpoints, preemption) is
``bertjax.pretrain.loop.train_and_evaluate``; its inputs and pre-compile checks are in
``bertjax.pretrain.inputs``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bertjax.data import pipeline
from bertjax.model import losses
from bertjax.model.config import BertConfig
from bertjax.model.heads import BertForPreTraining
from bertjax.training import optimizer
from bertjax.training import sharding as sh

# The batch contract's keys (the pipeline module imports neither TensorFlow nor JAX on import).
BATCH_KEYS = pipeline.STEP_FEATURES


class TrainState(flax.struct.PyTreeNode):
    step: jax.Array  # <int32>[] number of updates applied
    params: Any
    opt_state: Any
    nonfinite_skips: jax.Array  # <int32>[] updates skipped because of NaN/Inf


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """The scalars of the run config the step needs (hashable; bound with functools.partial)."""

    grad_accum_steps: int = 1
    nsp_loss_weight: float = 1.0
    skip_nonfinite: bool = False  # keep the old state on a non-finite step (else the loop stops)


def bert_config_from(config) -> BertConfig:
    """``config.model`` as a BertConfig (ValueError naming the field when it cannot work)."""
    return BertConfig.from_dict(config.model.to_dict(), source="config.model")


def step_config_from(config) -> StepConfig:
    return StepConfig(
        int(config.train.grad_accum_steps),
        float(config.train.nsp_loss_weight),
        bool(config.train.skip_nonfinite),
    )


def schedule_steps(config) -> int:
    return int(config.optimizer.decay_steps) or int(config.train.num_steps)


# ---------------------------------------------------------------- state and shardings


def _dummy_inputs(batch: int, length: int, predictions: int):
    ids = jnp.zeros((batch, length), jnp.int32)
    return ids, ids, ids, jnp.zeros((batch, predictions), jnp.int32)


def _init_params(model: nn.Module, rng, length: int, predictions: int):
    return model.init({"params": rng}, *_dummy_inputs(1, length, predictions))["params"]


def state_shardings(model: nn.Module, tx, mesh: Mesh, rules, length: int, predictions: int):
    """(abstract TrainState, TrainState of NamedShardings) without allocating anything."""
    boxed = jax.eval_shape(
        functools.partial(_init_params, model, length=length, predictions=predictions),
        jax.random.key(0),
    )
    param_specs = nn.get_partition_spec(boxed)
    abstract_params = nn.unbox(boxed)
    abstract_opt, opt_specs = sh.optimizer_state_specs(tx, abstract_params, param_specs)
    scalar = jax.ShapeDtypeStruct((), jnp.int32)
    abstract = TrainState(scalar, abstract_params, abstract_opt, scalar)
    specs = TrainState(PartitionSpec(), param_specs, opt_specs, PartitionSpec())
    shardings = nn.logical_to_mesh_sharding(specs, mesh, sh.normalize_rules(rules))
    return abstract, shardings


def init_train_state(
    model, tx, shardings, rng, length: int, predictions: int, params=None
) -> TrainState:
    """Materialises the state straight into ``shardings`` (fresh, or from given ``params``)."""

    def init(rng, params):
        if params is None:
            params = nn.unbox(_init_params(model, rng, length, predictions))
        zero = jnp.zeros((), jnp.int32)
        return TrainState(zero, params, tx.init(params), zero)

    if params is not None:
        params = jax.tree.map(sh.put_global, params, shardings.params)
    return jax.jit(init, out_shardings=shardings)(rng, params)


# ---------------------------------------------------------------- steps


def _forward_sums(model, params, batch, dropout_rng):
    out = model.apply(
        {"params": params},
        batch["input_ids"],
        batch["segment_ids"],
        batch["input_mask"],
        batch["masked_lm_positions"],
        deterministic=dropout_rng is None,
        rngs=None if dropout_rng is None else {"dropout": dropout_rng},
    )
    return losses.pretraining_sums(out.mlm_logits, out.nsp_logits, batch)


def _split_micro(batch, num_micro: int):
    """<..>[B, ...] -> <..>[A, B/A, ...]; row r of micro-batch a is row r*A + a, so every
    micro-batch keeps the batch's data-parallel layout (each shard splits locally)."""

    def split(x):
        x = x.reshape(x.shape[0] // num_micro, num_micro, *x.shape[1:])
        return jnp.swapaxes(x, 0, 1)

    return jax.tree.map(split, batch)


def loss_and_grads(model, params, batch, rng, step_config: StepConfig):
    """Gradient of the global-batch loss, accumulated over micro-batches. Returns (sums, grads)."""
    mlm_den = jnp.sum(batch["masked_lm_weights"].astype(jnp.float32))
    nsp_den = jnp.sum(losses.example_weights(batch))

    def micro_loss(params, micro, micro_rng):
        sums = _forward_sums(model, params, micro, micro_rng)
        return losses.total_loss(sums, mlm_den, nsp_den, step_config.nsp_loss_weight), sums

    grad_fn = jax.grad(micro_loss, has_aux=True)
    if step_config.grad_accum_steps == 1:
        grads, sums = grad_fn(params, batch, rng)
        return sums, grads

    def body(carry, xs):
        index, micro = xs
        grads, sums = grad_fn(params, micro, jax.random.fold_in(rng, index))
        return jax.tree.map(jnp.add, carry, (sums, grads)), None

    micro = _split_micro(batch, step_config.grad_accum_steps)
    zero_sums = jax.eval_shape(
        lambda: _forward_sums(model, params, jax.tree.map(lambda x: x[0], micro), rng)
    )
    init = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (zero_sums, params))
    (sums, grads), _ = jax.lax.scan(body, init, (jnp.arange(step_config.grad_accum_steps), micro))
    return sums, grads


def train_step(
    state: TrainState, batch, rng, *, model, tx, step_config: StepConfig, schedule
) -> tuple[TrainState, dict]:
    """One optimizer update on the global batch. Pure; see the module docstring."""
    step_rng = jax.random.fold_in(rng, state.step)
    sums, grads = loss_and_grads(model, state.params, batch, step_rng, step_config)
    loss = losses.total_loss(
        sums, sums["mlm_weight_sum"], sums["nsp_weight_sum"], step_config.nsp_loss_weight
    )
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
    )
    return new_state, metrics


def eval_step(params, batch, *, model) -> dict:
    """Deterministic MLM/NSP sums on one global eval batch (pad rows have zero weights)."""
    return _forward_sums(model, params, batch, None)


# ---------------------------------------------------------------- compilation and batches


def batch_shardings(mesh: Mesh, batch_spec: dict) -> dict:
    return {k: sh.batch_sharding(mesh, len(v.shape)) for k, v in batch_spec.items()}


def abstract_batch(global_batch: int, length: int, predictions: int, eval: bool = False) -> dict:
    """The global batch spec; eval batches also carry ``example_weight <float32>[B]``."""
    i32, f32 = jnp.int32, jnp.float32
    spec = {k: ((global_batch, length), i32) for k in BATCH_KEYS[:3]}
    spec.update(
        masked_lm_positions=((global_batch, predictions), i32),
        masked_lm_ids=((global_batch, predictions), i32),
        masked_lm_weights=((global_batch, predictions), f32),
        next_sentence_labels=((global_batch,), i32),
    )
    if eval:
        spec["example_weight"] = ((global_batch,), f32)
    return {k: jax.ShapeDtypeStruct(*v) for k, v in spec.items()}


def jit_train_step(model, tx, schedule, step_config, mesh, rules, shardings, batch_spec):
    """``train_step`` jitted once with in/out shardings and the state donated."""
    replicated = NamedSharding(mesh, PartitionSpec())
    fn = functools.partial(
        train_step, model=model, tx=tx, step_config=step_config, schedule=schedule
    )
    jitted = jax.jit(
        fn,
        in_shardings=(shardings, batch_shardings(mesh, batch_spec), replicated),
        out_shardings=(shardings, replicated),
        donate_argnums=(0,),
    )
    return _with_rules(jitted, mesh, rules)


def jit_eval_step(model, mesh, rules, param_shardings, batch_spec):
    replicated = NamedSharding(mesh, PartitionSpec())
    jitted = jax.jit(
        functools.partial(eval_step, model=model),
        in_shardings=(param_shardings, batch_shardings(mesh, batch_spec)),
        out_shardings=replicated,
    )
    return _with_rules(jitted, mesh, rules)


@dataclasses.dataclass(frozen=True)
class Steps:
    """Everything ``bertjax.main`` compiles for a config on a mesh, built without allocating:
    the loop runs it, ``python -m bertjax.compile`` lowers it for a TPU topology."""

    bert_config: BertConfig
    model: nn.Module
    tx: Any
    mesh: Mesh
    abstract_state: TrainState  # of jax.ShapeDtypeStruct
    state_shardings: TrainState  # of NamedSharding
    train_step: Any  # jitted, called and lowered inside the mesh's tracing context
    eval_step: Any
    train_batch: dict  # abstract global batches (jax.ShapeDtypeStruct)
    eval_batch: dict


def build_steps(config, mesh: Mesh) -> Steps:
    """The model, optimizer, abstract state with its shardings, and the train and eval steps
    jitted once for ``config``'s global batch shapes on ``mesh``. Nothing is allocated."""
    bert_config = sh.bert_config_for(bert_config_from(config), mesh)
    length, predictions = int(config.data.max_seq_length), int(config.data.max_predictions_per_seq)
    model = BertForPreTraining(bert_config)
    tx = optimizer.create_optimizer(config.optimizer, schedule_steps(config))
    schedule = optimizer.learning_rate_schedule(config.optimizer, schedule_steps(config))
    abstract, shardings = state_shardings(model, tx, mesh, config.mesh.rules, length, predictions)
    sh.check_divisible(abstract.params, shardings.params, mesh)
    train_batch = abstract_batch(int(config.train.global_batch_size), length, predictions)
    eval_batch = abstract_batch(int(config.train.eval_batch_size), length, predictions, eval=True)
    rules = config.mesh.rules
    train = jit_train_step(
        model, tx, schedule, step_config_from(config), mesh, rules, shardings, train_batch
    )
    evaluate = jit_eval_step(model, mesh, rules, shardings.params, eval_batch)
    return Steps(
        bert_config, model, tx, mesh, abstract, shardings, train, evaluate, train_batch, eval_batch
    )


class _with_rules:  # noqa: N801 - used like a decorator function
    """Calls / lowers a jitted function inside ``sharding.tracing_on(mesh, rules)``."""

    def __init__(self, jitted, mesh, rules):
        self.jitted, self.mesh, self.rules = jitted, mesh, sh.normalize_rules(rules)

    def __call__(self, *args):
        with sh.tracing_on(self.mesh, self.rules):
            return self.jitted(*args)

    def lower(self, *args):
        with sh.tracing_on(self.mesh, self.rules):
            return self.jitted.lower(*args)
