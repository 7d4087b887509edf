"""The fine-tuning train step and the device mesh it runs on (the pretraining contract).

``train_step(state, batch, rng) -> (state, metrics)`` is pure; :class:`Runner` jits it once per run
length with in/out shardings and the state donated. The mesh is ``config.mesh.shape`` over the
``('data', 'fsdp', 'tensor')`` axes and the params are sharded by their logical axes through
``config.mesh.rules``, as in pretraining (``bertjax.training.sharding``): the state is built
abstractly (``jax.eval_shape``), its shardings come from the logical axes, and it is materialised by
a jitted init with ``out_shardings``; batches are split over ``('data', 'fsdp')``. Every process
holds the whole (small) fine-tuning set and the whole global batch, and places only the shards of
its own devices (``bertjax.training.sharding.put_global``). The dropout key is ``fold_in(rng,
state.step)``; metrics are sums divided on the host.
"""

from __future__ import annotations

import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import linen as nn
from jax.sharding import NamedSharding, PartitionSpec

from bertjax.finetune.tasks import FinetuneInputError
from bertjax.model import heads, losses
from bertjax.model.config import BertConfig
from bertjax.training import optimizer
from bertjax.training import sharding as sh

MODEL_INPUTS = ("input_ids", "segment_ids", "input_mask")


def build_model(task, bert_config: BertConfig) -> nn.Module:
    """The model of ``task.head`` (``bertjax.model.heads``) on ``bert_config``."""
    if task.head in ("classification", "regression"):
        return heads.BertForSequenceClassification(bert_config, task.num_labels)
    if task.head == "span":
        return heads.BertForQuestionAnswering(bert_config)
    if task.head == "tagging":
        return heads.BertForTokenClassification(bert_config, task.num_labels)
    return heads.BertForMultipleChoice(bert_config)


def model_input_specs(example: dict) -> list[jax.ShapeDtypeStruct]:
    """Shapes of one example's model inputs (batch 1) from feature arrays with leading dim N."""
    return [jax.ShapeDtypeStruct((1, *example[k].shape[1:]), np.int32) for k in MODEL_INPUTS]


def task_loss(head: str, logits: jax.Array, batch: dict) -> tuple[jax.Array, jax.Array]:
    """(loss sum, weight sum) of one batch; padded examples have ``example_weights`` 0."""
    weights = batch["example_weights"]
    if head == "regression":
        return jnp.sum(weights * (logits[:, 0] - batch["label_ids"]) ** 2), jnp.sum(weights)
    if head == "span":
        start = losses.weighted_cross_entropy(logits[..., 0], batch["start_positions"], weights)
        end = losses.weighted_cross_entropy(logits[..., 1], batch["end_positions"], weights)
        return (start["loss_sum"] + end["loss_sum"]) / 2, start["weight_sum"]
    if head == "tagging":
        token_weights = batch["label_weights"] * weights[:, None]
        sums = losses.weighted_cross_entropy(logits, batch["label_ids"], token_weights)
        return sums["loss_sum"], sums["weight_sum"]
    sums = losses.weighted_cross_entropy(logits, batch["label_ids"], weights)
    return sums["loss_sum"], sums["weight_sum"]


class FinetuneState(flax.struct.PyTreeNode):
    step: jax.Array  # <int32>[] updates applied
    params: Any
    opt_state: Any
    learning_rate: jax.Array  # <float32>[] peak learning rate (the optimizer is built for 1.0)


def train_step(state, batch, rng, *, head: str, apply_fn, tx):
    """One update on a global batch -> (state, {"loss_sum", "weight_sum"}).

    ``tx`` is built with peak learning rate 1 and its updates are scaled by
    ``state.learning_rate``: every optimizer here is linear in the learning rate, so this equals
    building it with the real one, and one compiled step serves a whole learning-rate sweep.
    """
    step_rng = jax.random.fold_in(rng, state.step)

    def loss_fn(params):
        logits = apply_fn(
            {"params": params},
            *(batch[k] for k in MODEL_INPUTS),
            deterministic=False,
            rngs={"dropout": step_rng},
        )
        loss_sum, weight_sum = task_loss(head, logits, batch)
        return loss_sum / jnp.maximum(weight_sum, 1.0), (loss_sum, weight_sum)

    grads, (loss_sum, weight_sum) = jax.grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    updates = jax.tree.map(lambda u: u * state.learning_rate.astype(u.dtype), updates)
    state = state.replace(
        step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state
    )
    return state, {"loss_sum": loss_sum, "weight_sum": weight_sum}


class Runner:
    """The mesh, the state/batch shardings and the jitted steps for one (task, model) pair.

    ``devices``: the devices of the mesh (default all; ``config.mesh.shape`` must fit them).
    """

    def __init__(self, task, model: nn.Module, config, devices=None):
        self.task, self.model, self.config = task, model, config
        self.mesh = sh.create_mesh(config.mesh.shape, devices)
        self.model = model.clone(config=sh.bert_config_for(model.config, self.mesh))
        self.rules = sh.normalize_rules(config.mesh.rules)
        shards = sh.num_batch_shards(self.mesh)
        for name in ("batch_size", "eval_batch_size"):
            if config[name] % shards:
                raise FinetuneInputError(
                    f"config.{name}={config[name]} is not divisible by {shards} data shards "
                    f"(config.mesh.shape={tuple(self.mesh.shape.values())})"
                )
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self._params = None  # (abstract params, logical specs, shardings), from the first example
        self._steps = {}  # num_train_steps -> (schedule, state shardings, jitted init, jitted step)
        self._logits = None

    def _call(self, fn, *args):
        with sh.tracing_on(self.mesh, self.rules):
            return fn(*args)

    def param_shardings(self, example: dict):
        """NamedShardings of the params (from their logical axes), given feature arrays."""
        if self._params is None:
            boxed = jax.eval_shape(self.model.init, jax.random.key(0), *model_input_specs(example))[
                "params"
            ]
            specs = nn.get_partition_spec(boxed)
            shardings = sh.logical_to_sharding(specs, self.mesh, self.rules)
            sh.check_divisible(nn.unbox(boxed), shardings, self.mesh)
            self._params = (nn.unbox(boxed), specs, shardings)
        return self._params[2]

    def place(self, params, example: dict):
        """Host (or differently placed) params -> global arrays in the param shardings."""
        shardings = self.param_shardings(example)
        return jax.tree.map(
            lambda x, s: x if isinstance(x, jax.Array) and x.sharding == s else sh.put_global(x, s),
            params,
            shardings,
        )

    def _state_shardings(self, tx, example: dict) -> FinetuneState:
        params = self.param_shardings(example)
        abstract, specs, _ = self._params
        _, opt_specs = sh.optimizer_state_specs(tx, abstract, specs)
        opt = sh.logical_to_sharding(opt_specs, self.mesh, self.rules)
        return FinetuneState(self.replicated, params, opt, self.replicated)

    def _compile(self, num_train_steps: int, example: dict):
        opt_config = ml_collections.ConfigDict(self.config.optimizer.to_dict())
        opt_config.learning_rate = 1.0  # scaled by state.learning_rate in train_step
        opt_config.warmup_steps = int(num_train_steps * self.config.warmup_proportion)
        tx = optimizer.create_optimizer(opt_config, num_train_steps)
        schedule = optimizer.learning_rate_schedule(opt_config, num_train_steps)
        shardings = self._state_shardings(tx, example)
        batch = {k: sh.batch_sharding(self.mesh, v.ndim) for k, v in example.items()}
        batch["example_weights"] = sh.batch_sharding(self.mesh, 1)
        step = functools.partial(train_step, head=self.task.head, apply_fn=self.model.apply, tx=tx)
        step = jax.jit(
            step,
            in_shardings=(shardings, batch, self.replicated),
            out_shardings=(shardings, self.replicated),
            donate_argnums=(0,),
        )
        init = jax.jit(
            lambda params, lr: FinetuneState(jnp.zeros((), jnp.int32), params, tx.init(params), lr),
            out_shardings=shardings,
            donate_argnums=(0,),
        )
        return schedule, shardings, init, step

    def create_state(self, params, num_train_steps: int, learning_rate: float, example: dict):
        """-> (sharded state, learning-rate schedule, step fn(state, host batch, rng)).

        ``example``: the train feature arrays (their keys and ranks fix the batch shardings).
        """
        if num_train_steps not in self._steps:
            self._steps[num_train_steps] = self._compile(num_train_steps, example)
        schedule, shardings, init, step = self._steps[num_train_steps]
        params = jax.tree.map(sh.put_global, params, shardings.params)  # a fresh copy to donate
        state = self._call(init, params, sh.put_global(np.float32(learning_rate), self.replicated))

        def run(state, host_batch, rng):
            batch = {
                k: sh.put_global(v, sh.batch_sharding(self.mesh, np.ndim(v)))
                for k, v in host_batch.items()
            }
            return self._call(step, state, batch, rng)

        return state, (lambda i: learning_rate * float(schedule(i))), run

    def logits(self, params, features) -> np.ndarray:
        """Model outputs for every feature, in order: <float32>[N, ...]."""
        params = self.place(params, features.arrays)
        inputs = {k: sh.batch_sharding(self.mesh, features.arrays[k].ndim) for k in MODEL_INPUTS}
        if self._logits is None:
            self._logits = jax.jit(
                lambda params, batch: self.model.apply(
                    {"params": params}, *(batch[k] for k in MODEL_INPUTS), deterministic=True
                ),
                in_shardings=(self.param_shardings(features.arrays), inputs),
                out_shardings=self.replicated,
            )
        size, n = self.config.eval_batch_size, len(features)
        outputs = []
        for start in range(0, n, size):
            rows = {k: features.arrays[k][start : start + size] for k in MODEL_INPUTS}
            real = len(rows["input_ids"])
            batch = {k: sh.put_global(_pad_rows(v, size), inputs[k]) for k, v in rows.items()}
            outputs.append(np.asarray(self._call(self._logits, params, batch))[:real])
        return np.concatenate(outputs) if outputs else np.zeros((0,), np.float32)


def _pad_rows(x: np.ndarray, size: int) -> np.ndarray:
    if len(x) == size:
        return x
    return np.concatenate([x, np.zeros((size - len(x), *x.shape[1:]), x.dtype)])
