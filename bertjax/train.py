"""Pretraining: the sharded train state, pure train/eval steps jitted once, and the training loop.

Step contract: ``train_step(state, batch, rng) -> (state, metrics)`` is pure; it is jitted once
with in/out shardings and ``donate_argnums=(0,)``; the per-step dropout key is
``fold_in(rng, state.step)``; ``metrics`` are sums and counts (divided on the host by
``bertjax.metrics``). The state is built abstractly (``jax.eval_shape``), its shardings come from
the params' logical axes and ``config.mesh.rules``, and it is materialised by a jitted init with
``out_shardings`` so it never lands whole on one device.

Gradient accumulation splits the global batch into ``grad_accum_steps`` micro-batches and sums
the gradients of ``sum_loss_i / global_denominator``, so the update equals the unaccumulated one.
Every step returns a ``nonfinite`` flag (NaN/Inf loss or gradient norm). With
``train.skip_nonfinite`` the step itself keeps the old params and optimizer state and counts a
skip; otherwise (the default, which saves a select over the whole state every step) the loop
checks the flag before it logs, evaluates or saves anything and stops with an error, so a
non-finite state is never written.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import signal
import time
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from etils import epath
from flax import linen as nn
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bertjax import checkpoint, losses, optimizer
from bertjax import metrics as metrics_lib
from bertjax import sharding as sh
from bertjax.heads import BertForPreTraining
from bertjax.model import BertConfig

BATCH_KEYS = (
    "input_ids",
    "segment_ids",
    "input_mask",
    "masked_lm_positions",
    "masked_lm_ids",
    "masked_lm_weights",
    "next_sentence_labels",
)


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
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    opt_specs = optax.tree_map_params(
        tx,
        lambda _, spec: spec,
        abstract_opt,
        param_specs,
        transform_non_params=lambda _: PartitionSpec(),
    )
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
        params = jax.tree.map(put_global, params, shardings.params)
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


def put_global(value, sharding) -> jax.Array:
    """A host value every process holds whole -> a global array in ``sharding`` (each process
    places only the shards of its own devices; works across processes, unlike device_put)."""
    value = np.asarray(value)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def make_global_batch(host_batch: dict, mesh: Mesh) -> dict:
    """The one host -> device boundary: this process's rows -> global arrays split over data."""
    return {
        k: jax.make_array_from_process_local_data(
            sh.batch_sharding(mesh, np.ndim(v)), np.asarray(v)
        )
        for k, v in host_batch.items()
    }


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


class _with_rules:  # noqa: N801 - used like a decorator function
    """Calls / lowers a jitted function inside the mesh and logical-axis-rules contexts."""

    def __init__(self, jitted, mesh, rules):
        self.jitted, self.mesh, self.rules = jitted, mesh, sh.normalize_rules(rules)

    def __call__(self, *args):
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            return self.jitted(*args)

    def lower(self, *args):
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            return self.jitted.lower(*args)


# ---------------------------------------------------------------- checks before compiling


def check_config(config, bert_config: BertConfig, mesh: Mesh, process_count: int) -> None:
    """Raises ValueError naming the config field when the run cannot work (before compiling)."""
    batch = int(config.train.global_batch_size)
    accum = int(config.train.grad_accum_steps)
    shards = sh.num_batch_shards(mesh)
    if batch <= 0 or accum <= 0:
        raise ValueError(
            f"config.train.global_batch_size={batch} and grad_accum_steps={accum} must be positive"
        )
    if batch % accum:
        raise ValueError(
            f"config.train.global_batch_size={batch} is not divisible by "
            f"config.train.grad_accum_steps={accum}"
        )
    if (batch // accum) % shards:
        raise ValueError(
            f"global batch {batch} / {accum} micro-batches = {batch // accum} is not "
            f"divisible by {shards} data shards (config.mesh.shape={mesh.shape})"
        )
    if batch % process_count:
        raise ValueError(
            f"config.train.global_batch_size={batch} is not divisible by {process_count} processes"
        )
    length = int(config.data.max_seq_length)
    if length > bert_config.max_position_embeddings:
        raise ValueError(
            f"config.data.max_seq_length={length} exceeds "
            f"config.model.max_position_embeddings="
            f"{bert_config.max_position_embeddings}"
        )
    if int(config.data.max_predictions_per_seq) > length:
        raise ValueError(
            f"config.data.max_predictions_per_seq="
            f"{config.data.max_predictions_per_seq} exceeds "
            f"config.data.max_seq_length={length}"
        )
    if int(config.train.eval_every) and int(config.train.eval_batch_size) % max(
        shards, process_count
    ):
        raise ValueError(
            f"config.train.eval_batch_size={config.train.eval_batch_size} is not "
            f"divisible by {max(shards, process_count)} data shards / processes"
        )


def check_batch(host_batch: dict, config, per_host_batch: int) -> None:
    """Checks the first batch against the config (TFRecords may disagree with it)."""
    expect = {
        "input_ids": (per_host_batch, int(config.data.max_seq_length)),
        "masked_lm_positions": (per_host_batch, int(config.data.max_predictions_per_seq)),
    }
    missing = [k for k in BATCH_KEYS if k not in host_batch]
    if missing:
        raise ValueError(f"input batches lack features {missing}; expected {list(BATCH_KEYS)}")
    for key, shape in expect.items():
        got = tuple(np.shape(host_batch[key]))
        if got != shape:
            raise ValueError(
                f"input batch {key} has shape {got} but the config implies {shape} "
                "(config.data.max_seq_length, max_predictions_per_seq, "
                "per-host batch)"
            )


# ---------------------------------------------------------------- data


def synthetic_batches(
    vocab_size: int,
    batch_size: int,
    length: int,
    predictions: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
    start_batch: int = 0,
):
    """Random batches of the pretraining batch spec, a pure function of (seed, position).

    Global batch ``k`` is drawn whole and host ``h`` keeps its rows ``h*B .. (h+1)*B - 1``, so
    the global batch does not depend on the process count. For benchmarks and smoke tests
    (``config.train.synthetic_data``); there is nothing to learn in it.
    """
    index, rows = start_batch, batch_size * process_count
    mine = slice(process_index * batch_size, (process_index + 1) * batch_size)
    while True:
        rng = np.random.default_rng([seed, index])
        input_ids = rng.integers(5, vocab_size, (rows, length), dtype=np.int32)[mine]
        order = np.argsort(rng.random((rows, length - 1)), axis=1)[mine]
        positions = np.sort(order[:, :predictions] + 1, axis=1).astype(np.int32)
        labels = rng.integers(0, 2, (rows,), dtype=np.int32)[mine]
        segments = (np.arange(length)[None] >= length // 2).astype(np.int32)
        yield {
            "input_ids": input_ids,
            "segment_ids": segments.repeat(batch_size, 0),
            "input_mask": np.ones((batch_size, length), np.int32),
            "masked_lm_positions": positions,
            "masked_lm_ids": np.take_along_axis(input_ids, positions, axis=1),
            "masked_lm_weights": np.ones((batch_size, predictions), np.float32),
            "next_sentence_labels": labels,
        }
        index += 1


def data_signature(config) -> str:
    """Names the data stream; a resumed run continues its position only on the same stream."""
    return json.dumps(
        {
            "data": config.data.to_dict(),
            "seed": config.seed,
            "synthetic": config.train.synthetic_data,
            "batch": config.train.global_batch_size,
        },
        sort_keys=True,
        default=str,
    )


def host_batches(config, bert_config, *, split: str, batch_size: int, start_batch: int = 0):
    """Iterator of this process's numpy batches (``batch_size`` rows each)."""
    length, predictions = int(config.data.max_seq_length), int(config.data.max_predictions_per_seq)
    if config.train.synthetic_data:
        seed = config.seed + (0 if split == "train" else 1)
        gen = synthetic_batches(
            bert_config.vocab_size,
            batch_size,
            length,
            predictions,
            seed,
            jax.process_index(),
            jax.process_count(),
            start_batch,
        )
        return gen if split == "train" else itertools.islice(gen, config.train.eval_steps)
    from bertjax import input_pipeline  # noqa: PLC0415 - TF is only needed for real data

    dataset = input_pipeline.create_pretrain_dataset(
        config.data,
        batch_size=batch_size,
        seed=config.seed,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        split=split,
        start_batch=start_batch,
    )
    return dataset.as_numpy_iterator()


def check_data(config, bert_config: BertConfig) -> None:
    """The data config itself (input_pipeline's checks) and the vocab against the model."""
    if config.train.synthetic_data:
        return
    from bertjax import input_pipeline  # noqa: PLC0415

    input_pipeline.check_data_config(config.data, config.model)
    path = epath.Path(config.data.vocab_file)
    if not path.exists():
        raise ValueError(f"config.data.vocab_file={path}: file not found")
    lines = sum(1 for line in path.read_text().splitlines() if line.strip())
    if lines != bert_config.vocab_size:
        raise ValueError(
            f"config.model.vocab_size={bert_config.vocab_size} but "
            f"config.data.vocab_file={path} has {lines} entries"
        )


# ---------------------------------------------------------------- the training loop


class _Preemption:
    """SIGTERM (Cloud TPU maintenance / spot preemption) -> save at the current step, exit 0."""

    def __init__(self):
        self.requested = False
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        del signum, frame
        self.requested = True

    def agreed(self) -> bool:
        """All hosts agree: any host's request stops every host at the same step."""
        if jax.process_count() == 1:
            return self.requested
        flags = multihost_utils.process_allgather(np.asarray(self.requested, np.int32))
        return bool(np.any(flags))

    def restore(self):
        signal.signal(signal.SIGTERM, self._previous)


def _restore_or_init(config, manager, model, tx, abstract, shardings, length, predictions):
    """Restore order: workdir latest -> config.init_checkpoint (params only) -> fresh."""
    rng = jax.random.key_data(jax.random.key(config.seed))
    init_rng, train_rng = jax.random.split(jax.random.key(config.seed))
    abstract_rng = jax.ShapeDtypeStruct(rng.shape, rng.dtype)
    restored = checkpoint.restore_train_state(manager, abstract, shardings, abstract_rng)
    if restored is not None:
        state, rng_data, meta = restored
        print(f"restored step {int(state.step)} from {manager.directory}", flush=True)
        return state, np.asarray(rng_data), meta
    params = None
    if config.init_checkpoint:
        params, _, _ = checkpoint.load_params(
            config.init_checkpoint, scan_layers=config.model.scan_layers
        )
        if set(params) != set(abstract.params):
            raise checkpoint.CheckpointError(
                f"config.init_checkpoint={config.init_checkpoint}: has heads {sorted(params)}, "
                f"pretraining needs {sorted(abstract.params)}"
            )
        print(f"initialised params from {config.init_checkpoint}", flush=True)
    state = init_train_state(model, tx, shardings, init_rng, length, predictions, params)
    return state, np.asarray(jax.random.key_data(train_rng)), None


def _evaluate(config, bert_config, eval_fn, params) -> dict:
    acc = metrics_lib.Accumulator()
    per_host = int(config.train.eval_batch_size) // jax.process_count()
    batches = host_batches(config, bert_config, split="eval", batch_size=per_host)
    mesh = eval_fn.mesh
    for batch in itertools.islice(batches, int(config.train.eval_steps)):
        batch = {k: batch[k] for k in (*BATCH_KEYS, "example_weight") if k in batch}
        batch.setdefault("example_weight", np.ones(per_host, np.float32))
        acc.add(jax.device_get(eval_fn(params, make_global_batch(batch, mesh))))
    return metrics_lib.summarize_eval(acc.sums) if acc.sums else {}


def train_and_evaluate(config, workdir: str) -> dict:
    """Pretrains per ``config`` in ``workdir`` (resuming if it holds a checkpoint).

    Returns the final summary dict (last train window and eval values). Raises ValueError for a
    config that cannot work, FloatingPointError on a non-finite step (unless skipping).
    """
    bert_config = bert_config_from(config)
    mesh = sh.create_mesh(config.mesh.shape)
    check_config(config, bert_config, mesh, jax.process_count())
    check_data(config, bert_config)
    length, predictions = int(config.data.max_seq_length), int(config.data.max_predictions_per_seq)
    model = BertForPreTraining(bert_config)
    tx = optimizer.create_optimizer(config.optimizer, schedule_steps(config))
    schedule = optimizer.learning_rate_schedule(config.optimizer, schedule_steps(config))
    abstract, shardings = state_shardings(model, tx, mesh, config.mesh.rules, length, predictions)
    if jax.process_index() == 0 and not config.train.synthetic_data:
        checkpoint.write_workdir_info(
            workdir,
            bert_config,
            config.data.vocab_file,
            config.data.do_lower_case,
            config.to_json_best_effort(),
        )
    manager = checkpoint.create_manager(
        workdir, config.checkpoint.every_steps, config.checkpoint.keep, config.checkpoint.async_save
    )
    state, rng_data, meta = _restore_or_init(
        config, manager, model, tx, abstract, shardings, length, predictions
    )
    signature = data_signature(config)
    start_step = int(state.step)
    # Data offset: the step at which the current stream started (0 unless the data changed).
    offset = (
        start_step - meta["data_position"]
        if meta and meta["data_signature"] == signature
        else start_step
    )
    global_batch = int(config.train.global_batch_size)
    batch_spec = abstract_batch(global_batch, length, predictions)
    step_fn = jit_train_step(
        model,
        tx,
        schedule,
        step_config_from(config),
        mesh,
        config.mesh.rules,
        shardings,
        batch_spec,
    )
    eval_fn = jit_eval_step(
        model,
        mesh,
        config.mesh.rules,
        shardings.params,
        abstract_batch(int(config.train.eval_batch_size), length, predictions, eval=True),
    )
    eval_fn.mesh = mesh
    rng = put_global(rng_data, NamedSharding(mesh, PartitionSpec()))
    batches = host_batches(
        config,
        bert_config,
        split="train",
        batch_size=global_batch // jax.process_count(),
        start_batch=start_step - offset,
    )
    loop = _Loop(config, workdir, bert_config, manager, signature, offset, rng_data)
    try:
        return loop.run(state, step_fn, eval_fn, rng, batches, mesh)
    finally:
        loop.close()


class _Loop:
    """The host side of training: stepping, logging, eval, checkpoints, preemption, NaN policy."""

    def __init__(self, config, workdir, bert_config, manager, signature, offset, rng_data):
        self.config, self.manager, self.signature = config, manager, signature
        self.offset, self.rng_data = offset, rng_data
        self.num_steps = int(config.train.num_steps)
        self.length = int(config.data.max_seq_length)
        devices = jax.device_count()
        peak = metrics_lib.peak_flops_per_device(float(config.train.peak_flops))
        self.peak_total = peak * devices if peak else None
        self.flops_per_sequence = metrics_lib.train_flops_per_sequence(
            bert_config, self.length, int(config.data.max_predictions_per_seq)
        )
        self.writer = metrics_lib.SummaryWriter(
            str(epath.Path(workdir) / "tensorboard"), enabled=jax.process_index() == 0
        )
        self.bert_config = bert_config
        self.preemption = _Preemption()
        self.window = metrics_lib.Accumulator()
        self.summary: dict = {}
        self.last_saved = -1

    def run(self, state, step_fn, eval_fn, rng, batches, mesh) -> dict:
        config, step = self.config, int(state.step)
        self.last_saved = step if self.manager.latest_step() == step else -1
        first, pending, started = True, None, time.perf_counter()
        start_step = step
        while step < self.num_steps:
            if self.preemption.agreed():
                logging.warning("SIGTERM: saving step %d and exiting", step)
                break
            host_batch = next(batches)
            if first:
                check_batch(
                    host_batch, config, int(config.train.global_batch_size) // jax.process_count()
                )
                first = False
            host_batch = {k: host_batch[k] for k in BATCH_KEYS}  # example_weight: eval only
            state, step_metrics = step_fn(state, make_global_batch(host_batch, mesh), rng)
            step += 1
            # Metrics are fetched one step late so the host never waits for the device, except
            # at a boundary, where a NaN must be caught before anything is logged or saved.
            if pending is not None:
                self._record(*pending)
            pending = (step, step_metrics)
            log = step % int(config.train.log_every) == 0 or step == self.num_steps
            evaluate = int(config.train.eval_every) and step % int(config.train.eval_every) == 0
            save = step % int(config.checkpoint.every_steps) == 0
            if log or evaluate or save:
                self._record(*pending)
                pending = None
            if log:
                self._log(step, start_step, started)
            if evaluate:
                self._eval(step, eval_fn, state.params)
            if save:
                self._save(step, state)
        if pending is not None:
            self._record(*pending)
        self._save(step, state)
        self.manager.wait_until_finished()
        if self.preemption.requested:
            return self.summary
        if int(config.train.eval_every) and self.summary.get("eval_step") != step:
            self._eval(step, eval_fn, state.params)
        self.summary["nonfinite_skips"] = int(state.nonfinite_skips)
        self.summary["step"] = step
        if jax.process_index() == 0:
            print(
                "final summary: " + json.dumps(self.summary, sort_keys=True, default=float),
                flush=True,
            )
        return self.summary

    def _record(self, step: int, step_metrics) -> None:
        values = jax.device_get(step_metrics)
        if values["nonfinite"] and not self.config.train.skip_nonfinite:
            self.manager.wait_until_finished()
            raise FloatingPointError(
                f"non-finite loss or gradient at step {step} (loss={float(values['loss_sum'])}, "
                f"grad_norm={float(values['grad_norm_sum'])}); the update was not applied and no "
                "checkpoint was written for it (set config.train.skip_nonfinite=True to skip)"
            )
        if values["nonfinite"]:
            logging.warning("skipped the update of step %d: non-finite loss or gradient", step)
            return
        self.last_lr = float(values.pop("learning_rate"))
        values.pop("nonfinite")
        self.window.add(values)

    def _log(self, step: int, start_step: int, started: float) -> None:
        if not self.window.sums:
            return
        values = metrics_lib.summarize_train(
            self.window.sums,
            self.window.elapsed(),
            global_batch=int(self.config.train.global_batch_size),
            length=self.length,
            flops_per_sequence=self.flops_per_sequence,
            peak_flops_total=self.peak_total,
        )
        rate = (step - start_step) / max(time.perf_counter() - started, 1e-9)
        line = metrics_lib.format_train_line(
            step, self.num_steps, values, self.last_lr, (self.num_steps - step) / rate
        )
        if jax.process_index() == 0:
            print(line, flush=True)
        self.writer.scalars(step, {**values, "learning_rate": self.last_lr}, "train")
        self.summary["train"] = values
        self.window.reset()

    def _eval(self, step: int, eval_fn, params) -> None:
        values = _evaluate(self.config, self.bert_config, eval_fn, params)
        if not values:
            return
        if jax.process_index() == 0:
            print(
                f"eval step {step} " + " ".join(f"{k} {v:.4f}" for k, v in values.items()),
                flush=True,
            )
        self.writer.scalars(step, values, "eval")
        self.summary["eval"], self.summary["eval_step"] = values, step

    def _save(self, step: int, state) -> None:
        if step == self.last_saved or step == 0:
            return
        meta = {"step": step, "data_signature": self.signature, "data_position": step - self.offset}
        checkpoint.save_train_state(self.manager, step, state, self.rng_data, meta)
        self.last_saved = step

    def close(self) -> None:
        self.preemption.restore()
        self.writer.close()
        self.manager.close()
