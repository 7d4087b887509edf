"""Fine-tuning: model from any checkpoint, a jitted data-parallel step, evaluation, predict, sweep.

``run(config, workdir)`` dispatches on ``config.mode``:

* ``train``: fine-tune on the train split, evaluate every dev split, write into ``workdir``::

      eval_results.json        {"task", "dev": {split: metrics}, "skipped": {...}, "hparams"}
      predictions/             dev predictions + test predictions in each benchmark's format
      tensorboard/             train loss and learning rate, dev metrics
      checkpoint/              the fine-tuned params (``bertjax.checkpoint`` params-only layout)

* ``predict``: load ``workdir/checkpoint`` (or ``config.predict_checkpoint``) and write
  predictions for the task's test splits found in ``config.data_dir`` (no labels needed).
* ``sweep``: the paper's selection: every learning rate in ``config.sweep.learning_rates`` times
  ``config.sweep.num_restarts`` seeds (different shuffling and head init, same checkpoint); the
  run with the best dev ``task.primary_metric`` is kept as ``workdir/checkpoint`` and the table is
  written to ``workdir/sweep_results.{md,json}``.

Step contract as in ``bertjax.train``: ``train_step(state, batch, rng) -> (state, metrics)`` is
pure, jitted once with the batch sharded over the ``('data', 'fsdp')`` mesh axes and the params
replicated (fine-tuning models fit on one device), dropout key ``fold_in(rng, state.step)``,
metrics returned as sums divided on the host.
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from flax import linen as nn
from jax.sharding import NamedSharding, PartitionSpec

from bertjax import checkpoint, convert, heads, losses, optimizer
from bertjax import sharding as sh
from bertjax.finetune import tasks
from bertjax.finetune.tasks import FinetuneInputError
from bertjax.model import BertConfig

MODEL_INPUTS = ("input_ids", "segment_ids", "input_mask")
_MODEL_OVERRIDES = (
    "hidden_dropout_rate",
    "attention_dropout_rate",
    "dtype",
    "scan_layers",
    "remat_policy",
)


def load_checkpoint(config) -> tuple[dict, BertConfig, str, bool]:
    """``config.init_checkpoint`` (bertjax / HF dir / TF1) -> (params, BertConfig, vocab, lower).

    ``config.model`` overrides dropout/dtype/layout; ``config.model.hidden_size`` (0 = any) must
    match the checkpoint's.
    """
    if not config.init_checkpoint:
        raise FinetuneInputError("config.init_checkpoint: expected a bertjax, HF or TF1 checkpoint")
    lower = None if config.do_lower_case == "auto" else config.do_lower_case == "true"
    conv = convert.load(config.init_checkpoint, do_lower_case=lower)
    if config.model.hidden_size and config.model.hidden_size != conv.config.hidden_size:
        raise FinetuneInputError(
            f"{config.init_checkpoint}: checkpoint hidden size {conv.config.hidden_size} != "
            f"config.model.hidden_size={config.model.hidden_size}"
        )
    bert_config = conv.config.replace(**{k: config.model[k] for k in _MODEL_OVERRIDES})
    params = conv.params
    if bert_config.scan_layers:
        from bertjax.model import stack_layers

        params = {**params, "encoder": stack_layers(params["encoder"], bert_config.num_layers)}
    return params, bert_config, conv.vocab_file, conv.do_lower_case


def build_model(task, bert_config: BertConfig) -> nn.Module:
    if task.head in ("classification", "regression"):
        return heads.BertForSequenceClassification(bert_config, task.num_labels)
    if task.head == "span":
        return heads.BertForQuestionAnswering(bert_config)
    if task.head == "tagging":
        return heads.BertForTokenClassification(bert_config, task.num_labels)
    return heads.BertForMultipleChoice(bert_config)


def init_params(model: nn.Module, pretrained: dict, example: dict, rng) -> dict:
    """The pretrained subtrees, plus fresh ones (the heads) initialised as ``bertjax.model`` does.

    Shapes come from ``jax.eval_shape`` (nothing is compiled); new kernels and embeddings are
    drawn from the truncated normal(0, initializer_range) seeded by ``rng``, biases are 0 and
    LayerNorm scales 1.
    """
    dummy = [jax.ShapeDtypeStruct((1, *example[k].shape[1:]), np.int32) for k in MODEL_INPUTS]
    shapes = nn.unbox(jax.eval_shape(model.init, rng, *dummy))["params"]
    stddev = model.config.initializer_range
    params = {}
    for index, (name, subtree) in enumerate(sorted(shapes.items())):
        if name in pretrained:
            got = jax.tree.map(np.shape, pretrained[name])
            if jax.tree.map(lambda x: tuple(x.shape), subtree) != got:
                raise FinetuneInputError(
                    f"init_checkpoint: subtree {name!r} has shapes {got}, the model expects "
                    f"{jax.tree.map(lambda x: tuple(x.shape), subtree)}"
                )
            params[name] = pretrained[name]
            continue
        leaves, treedef = jax.tree.flatten_with_path(subtree)
        keys = jax.random.split(jax.random.fold_in(rng, index), len(leaves))
        values = [
            _fresh(path[-1].key, leaf, key, stddev)
            for (path, leaf), key in zip(leaves, keys, strict=True)
        ]
        params[name] = jax.tree.unflatten(treedef, values)
    return params


def _fresh(leaf_name: str, leaf, key, stddev: float) -> np.ndarray:
    if leaf_name in ("kernel", "embedding"):
        return np.asarray(nn.initializers.truncated_normal(stddev)(key, leaf.shape, leaf.dtype))
    fill = 1.0 if leaf_name == "scale" else 0.0
    return np.full(leaf.shape, fill, leaf.dtype)


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
    """Jitted steps on a data-parallel mesh for one (task, model) pair."""

    def __init__(self, task, model: nn.Module, config):
        self.task, self.model, self.config = task, model, config
        self.mesh = sh.create_mesh((-1, 1, 1))
        shards = sh.num_batch_shards(self.mesh)
        for name in ("batch_size", "eval_batch_size"):
            if config[name] % shards:
                raise FinetuneInputError(
                    f"config.{name}={config[name]} is not divisible by {shards} data shards"
                )
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self._steps = {}  # num_train_steps -> (optimizer, schedule, jitted step)
        self._logits = jax.jit(
            lambda params, batch: model.apply(
                {"params": params}, *(batch[k] for k in MODEL_INPUTS), deterministic=True
            )
        )

    def to_device(self, batch: dict) -> dict:
        return {
            k: jax.device_put(v, sh.batch_sharding(self.mesh, v.ndim)) for k, v in batch.items()
        }

    def create_state(self, params, num_train_steps: int, learning_rate: float):
        """-> (replicated state, learning-rate schedule, jitted step) for this run length."""
        if num_train_steps not in self._steps:
            opt_config = ml_collections.ConfigDict(self.config.optimizer.to_dict())
            opt_config.learning_rate = 1.0  # scaled by state.learning_rate in train_step
            opt_config.warmup_steps = int(num_train_steps * self.config.warmup_proportion)
            tx = optimizer.create_optimizer(opt_config, num_train_steps)
            schedule = optimizer.learning_rate_schedule(opt_config, num_train_steps)
            step = functools.partial(
                train_step, head=self.task.head, apply_fn=self.model.apply, tx=tx
            )
            self._steps[num_train_steps] = (tx, schedule, jax.jit(step, donate_argnums=(0,)))
        tx, schedule, step = self._steps[num_train_steps]
        state = FinetuneState(
            step=np.int32(0),
            params=params,
            opt_state=tx.init(params),
            learning_rate=np.float32(learning_rate),
        )
        scaled = lambda i: learning_rate * float(schedule(i))
        return jax.device_put(state, self.replicated), scaled, step

    def logits(self, params, features: tasks.Features) -> np.ndarray:
        """Model outputs for every feature, in order: <float32>[N, ...]."""
        size, n = self.config.eval_batch_size, len(features)
        outputs = []
        for start in range(0, n, size):
            batch = {k: features.arrays[k][start : start + size] for k in MODEL_INPUTS}
            real = len(batch["input_ids"])
            batch = {k: _pad_rows(v, size) for k, v in batch.items()}
            outputs.append(np.asarray(self._logits(params, self.to_device(batch)))[:real])
        return np.concatenate(outputs) if outputs else np.zeros((0,), np.float32)


def _pad_rows(x: np.ndarray, size: int) -> np.ndarray:
    if len(x) == size:
        return x
    return np.concatenate([x, np.zeros((size - len(x), *x.shape[1:]), x.dtype)])


def train_batches(features: tasks.Features, batch_size: int, num_steps: int, seed: int):
    """Shuffled full batches, one fresh permutation per epoch (the last partial batch dropped)."""
    rng = np.random.default_rng(seed)
    n = len(features)
    per_epoch = n // batch_size
    if per_epoch == 0:
        raise FinetuneInputError(
            f"train split has {n} features, fewer than one batch of {batch_size}"
        )
    step = 0
    while step < num_steps:
        order = rng.permutation(n)
        for i in range(min(per_epoch, num_steps - step)):
            index = order[i * batch_size : (i + 1) * batch_size]
            batch = {k: v[index] for k, v in features.arrays.items()}
            batch["example_weights"] = np.ones((batch_size,), np.float32)
            yield batch
            step += 1


def fit(runner: Runner, params, train_features, *, learning_rate: float, seed: int, writer=None):
    """Fine-tunes ``params`` -> (params, mean train loss of the last 10% of steps).

    Steps = features / batch_size * epochs (for SQuAD a feature is a doc-stride window), warmup
    over ``warmup_proportion`` of them, as the original run_classifier.py / run_squad.py.
    """
    config = runner.config
    num_steps = int(len(train_features) / config.batch_size * config.num_train_epochs)
    state, schedule, step_fn = runner.create_state(params, num_steps, learning_rate)
    rng = jax.random.key(seed)
    recent, started = [], time.time()
    for step, batch in enumerate(train_batches(train_features, config.batch_size, num_steps, seed)):
        state, metrics = step_fn(state, runner.to_device(batch), rng)
        if (step + 1) % config.log_every_steps == 0 or step + 1 == num_steps:
            metrics = jax.device_get(metrics)
            loss = float(metrics["loss_sum"] / max(metrics["weight_sum"], 1.0))
            recent.append(loss)
            logging.info(
                "step %d/%d loss %.4f (%.1fs)", step + 1, num_steps, loss, time.time() - started
            )
            if writer is not None:
                writer.scalar("train/loss", loss, step + 1)
                writer.scalar("train/learning_rate", float(schedule(step)), step + 1)
    tail = recent[-max(1, len(recent) // 10) :]
    return jax.device_get(state.params), (float(np.mean(tail)) if tail else float("nan"))


# ---- orchestration ------------------------------------------------------------------------------


class _Data:
    """Examples and features of every split a run needs, tokenized once."""

    def __init__(self, task, config, tokenizer, splits):
        self.examples, self.features = {}, {}
        for split in splits:
            examples = task.read(config.data_dir, split)
            self.examples[split] = examples
            self.features[split] = task.featurize(examples, tokenizer, config)
            logging.info(
                "%s/%s: %d examples -> %d features",
                task.name,
                split,
                len(examples),
                len(self.features[split]),
            )


def _prepare(config, checkpoint_path: str | None = None):
    import tensorflow as tf

    tf.config.set_visible_devices([], "GPU")  # TensorFlow only tokenizes; keep it off the GPU.
    task = tasks.get_task(config)
    if checkpoint_path is None:
        pretrained, bert_config, vocab_file, lower = load_checkpoint(config)
    else:
        pretrained, bert_config, meta = checkpoint.load_params(checkpoint_path)
        bert_config = bert_config.replace(**{k: config.model[k] for k in _MODEL_OVERRIDES})
        vocab_file, lower = (
            os.path.join(checkpoint_path, checkpoint.VOCAB_FILE),
            meta["do_lower_case"],
        )
    tokenizer = tasks.load_tokenizer(vocab_file, lower)
    return task, pretrained, bert_config, vocab_file, lower, tokenizer


def _existing(task, config, splits) -> list[str]:
    return [s for s in splits if os.path.exists(task.split_path(config.data_dir, s))]


def evaluate_and_write(runner, task, params, data: _Data, splits, out_dir, with_labels=True):
    """Runs the model on ``splits``; returns {split: metrics} (labelled splits only)."""
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    results = {}
    for split in splits:
        examples, features = data.examples[split], data.features[split]
        logits = runner.logits(params, features)
        if with_labels:
            results[split], _ = task.evaluate(examples, features, logits)
        if out_dir:
            task.write_predictions(out_dir, split, examples, features, logits)
    return results


def _write_json(path: str, value) -> None:
    tasks.write_text_atomically(path, json.dumps(value, indent=2, sort_keys=True) + "\n")


def _save(workdir, params, bert_config, vocab_file, lower) -> str:
    path = os.path.join(workdir, "checkpoint")
    checkpoint.save_params(path, params, bert_config, vocab_file, lower, overwrite=True)
    return path


def train_and_evaluate(config, workdir: str) -> dict:
    """Fine-tunes at ``config.learning_rate`` and writes everything listed in the module doc."""
    from flax.metrics import tensorboard

    os.makedirs(workdir, exist_ok=True)
    task, pretrained, bert_config, vocab_file, lower, tokenizer = _prepare(config)
    test_splits = _existing(task, config, task.test_splits)
    data = _Data(task, config, tokenizer, [task.train_split, *task.dev_splits, *test_splits])
    model = build_model(task, bert_config)
    runner = Runner(task, model, config)
    train_features = data.features[task.train_split]
    params = init_params(model, pretrained, train_features.arrays, jax.random.key(config.seed))
    writer = tensorboard.SummaryWriter(os.path.join(workdir, "tensorboard"))
    params, final_loss = fit(
        runner,
        params,
        train_features,
        learning_rate=config.learning_rate,
        seed=config.seed,
        writer=writer,
    )
    out_dir = os.path.join(workdir, "predictions")
    dev = evaluate_and_write(runner, task, params, data, task.dev_splits, out_dir)
    evaluate_and_write(runner, task, params, data, test_splits, out_dir, with_labels=False)
    for split, values in dev.items():
        for name, value in values.items():
            if isinstance(value, int | float):
                writer.scalar(f"{split}/{name}", value, 0)
    writer.flush()
    results = {
        "task": task.name,
        "dev": dev,
        "final_train_loss": final_loss,
        "skipped": {s: f.skipped for s, f in data.features.items() if f.skipped},
        "hparams": {
            "learning_rate": config.learning_rate,
            "batch_size": config.batch_size,
            "num_train_epochs": config.num_train_epochs,
            "seed": config.seed,
        },
    }
    _write_json(os.path.join(workdir, "eval_results.json"), results)
    _save(workdir, params, bert_config, vocab_file, lower)
    return results


def predict(config, workdir: str) -> list[str]:
    """Runs the fine-tuned ``workdir/checkpoint`` on the test splits present in data_dir."""
    path = config.predict_checkpoint or os.path.join(workdir, "checkpoint")
    task, params, bert_config, _, _, tokenizer = _prepare(config, checkpoint_path=path)
    splits = _existing(task, config, task.test_splits)
    if not splits:
        names = [task.split_path(config.data_dir, s) for s in task.test_splits]
        raise FinetuneInputError(f"config.data_dir={config.data_dir!r}: none of {names} exists")
    data = _Data(task, config, tokenizer, splits)
    model = build_model(task, bert_config)
    example = data.features[splits[0]].arrays
    dummy = [jax.ShapeDtypeStruct((1, *example[k].shape[1:]), np.int32) for k in MODEL_INPUTS]
    expected = jax.eval_shape(model.init, jax.random.key(0), *dummy)["params"]
    missing = sorted(set(expected) - set(params))
    if missing:
        raise FinetuneInputError(
            f"{path}: not a fine-tuned {task.name} checkpoint, missing {missing}"
        )
    params = init_params(model, params, data.features[splits[0]].arrays, jax.random.key(0))
    out_dir = os.path.join(workdir, "predictions")
    evaluate_and_write(
        Runner(task, model, config), task, params, data, splits, out_dir, with_labels=False
    )
    return sorted(os.listdir(out_dir))
