"""Fine-tuning: model from any checkpoint, training on the mesh, evaluation, predict, sweep.

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

The step, the mesh (``config.mesh``) and the shardings are in ``bertjax.finetune.step``: the same
contract and logical-axis sharding as pretraining.
"""

from __future__ import annotations

import json
import os
import time

import jax
import numpy as np
from absl import logging
from flax import linen as nn

from bertjax import checkpoint, convert, cpu_gemm, heads
from bertjax.finetune import tasks
from bertjax.finetune.step import Runner, model_input_specs
from bertjax.finetune.tasks import FinetuneInputError
from bertjax.model import BertConfig

_MODEL_OVERRIDES = (
    "hidden_dropout_rate",
    "attention_dropout_rate",
    "dtype",
    "scan_layers",
    "remat_policy",
    "matmul",
)


def model_overrides(config) -> dict:
    """The ``config.model`` fields a fine-tuning run sets on the checkpoint's BertConfig."""
    overrides = {k: config.model[k] for k in _MODEL_OVERRIDES}
    overrides["matmul"] = cpu_gemm.resolve(overrides["matmul"])
    return overrides


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
    bert_config = conv.config.replace(**model_overrides(config))
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
    shapes = nn.unbox(jax.eval_shape(model.init, rng, *model_input_specs(example)))["params"]
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
    """Fine-tunes ``params`` (host arrays) -> (params as global arrays in the runner's param
    shardings, mean train loss of the last 10% of logged steps).

    Steps = features / batch_size * epochs (for SQuAD a feature is a doc-stride window), warmup
    over ``warmup_proportion`` of them, as the original run_classifier.py / run_squad.py.
    """
    config = runner.config
    num_steps = int(len(train_features) / config.batch_size * config.num_train_epochs)
    state, schedule, step_fn = runner.create_state(
        params, num_steps, learning_rate, train_features.arrays
    )
    rng = jax.random.key(seed)
    recent, started = [], time.time()
    for step, batch in enumerate(train_batches(train_features, config.batch_size, num_steps, seed)):
        state, metrics = step_fn(state, batch, rng)
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
    return state.params, (float(np.mean(tail)) if tail else float("nan"))


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
        bert_config = bert_config.replace(**model_overrides(config))
        vocab_file, lower = (
            os.path.join(checkpoint_path, checkpoint.VOCAB_FILE),
            meta["do_lower_case"],
        )
    tokenizer = tasks.load_tokenizer(vocab_file, lower)
    return task, pretrained, bert_config, vocab_file, lower, tokenizer


def _existing(task, config, splits) -> list[str]:
    return [s for s in splits if task.has_split(config.data_dir, s)]


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
    expected = jax.eval_shape(model.init, jax.random.key(0), *model_input_specs(example))["params"]
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
