"""Fine-tuning: model from any checkpoint, training on the mesh, evaluation, predict, sweep.

``run(config, workdir)`` dispatches on ``config.mode``:

* ``train``: fine-tune on the train split, evaluate every dev split, write into ``workdir``::

      eval_results.json        {"task", "dev": {split: metrics}, "skipped": {...}, "hparams"}
                               (written last: its presence means every output is complete)
      predictions/             dev predictions + test predictions in each benchmark's format
      tensorboard/             train loss and learning rate, dev metrics
      checkpoint/              the fine-tuned params (params-only layout of
                               ``bertjax.training.checkpoint``)

* ``predict``: load ``workdir/checkpoint`` (or ``config.predict_checkpoint``) and write
  predictions for the task's test splits found in ``config.data_dir`` (no labels needed).
* ``sweep``: the paper's selection: every learning rate in ``config.sweep.learning_rates`` times
  ``config.sweep.num_restarts`` seeds (different shuffling and head init, same checkpoint); the
  run with the best dev ``task.primary_metric`` is kept as ``workdir/checkpoint`` and the table is
  written to ``workdir/sweep_results.{md,json}``.

The step, the mesh (``config.mesh``) and the shardings are in ``bertjax.finetune.step``: the same
contract and logical-axis sharding as pretraining; what the loop feeds it is
``bertjax.finetune.inputs``.

Progress is printed like pretraining's: a line after the first step (its time includes
compiling), then every ``config.log_every_steps`` steps, with the loss, learning rate,
examples/s, tokens/s (padded tokens processed) and an ETA; one line per evaluated split with its
metrics.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

import jax
import numpy as np

from bertjax import atomic
from bertjax.finetune import inputs
from bertjax.finetune.step import Runner, build_model, model_input_specs
from bertjax.finetune.tasks import FinetuneInputError
from bertjax.training import checkpoint
from bertjax.training.metrics import format_eta


class _Progress:
    """The console line of ``fit``: rates over the steps since the previous line."""

    def __init__(self, num_steps: int, tokens_per_example: int, batch_size: int):
        self.num_steps, self.batch_size = num_steps, batch_size
        self.tokens_per_example = tokens_per_example
        self.started = self.last_time = time.perf_counter()
        self.last_step = 0

    def line(self, step: int, loss: float, learning_rate: float) -> str:
        now = time.perf_counter()
        examples_per_sec = (
            (step - self.last_step) * self.batch_size / max(now - self.last_time, 1e-9)
        )
        steps_per_sec = step / max(now - self.started, 1e-9)
        self.last_step, self.last_time = step, now
        return (
            f"step {step}/{self.num_steps} loss {loss:.4f} lr {learning_rate:.3g} "
            f"ex/s {examples_per_sec:.1f} tok/s {examples_per_sec * self.tokens_per_example:.0f} "
            f"eta {format_eta((self.num_steps - step) / steps_per_sec)}"
        )


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
    tokens = int(np.prod(train_features.arrays["input_ids"].shape[1:]))
    progress, recent = _Progress(num_steps, tokens, config.batch_size), []
    batches = inputs.train_batches(train_features, config.batch_size, num_steps, seed)
    for step, batch in enumerate(batches, start=1):
        state, metrics = step_fn(state, batch, rng)
        if step == 1 or step % config.log_every_steps == 0 or step == num_steps:
            metrics = jax.device_get(metrics)
            loss = float(metrics["loss_sum"] / max(metrics["weight_sum"], 1.0))
            recent.append(loss)
            print(progress.line(step, loss, schedule(step - 1)), flush=True)
            if writer is not None:
                writer.scalar("train/loss", loss, step)
                writer.scalar("train/learning_rate", float(schedule(step - 1)), step)
    tail = recent[-max(1, len(recent) // 10) :]
    return state.params, (float(np.mean(tail)) if tail else float("nan"))


def _metrics_text(values: dict) -> str:
    return " ".join(
        f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
        for k, v in values.items()
        if isinstance(v, int | float)
    )


# ---- orchestration ------------------------------------------------------------------------------


def evaluate_and_write(runner, task, params, data, splits, out_dir, with_labels=True):
    """Runs the model on ``splits``; returns {split: metrics} (labelled splits only)."""
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    results = {}
    for split in splits:
        examples, features = data.examples[split], data.features[split]
        logits = runner.logits(params, features)
        if with_labels:
            results[split], _ = task.evaluate(examples, features, logits)
            print(f"eval {split}: {_metrics_text(results[split])}", flush=True)
        if out_dir:
            task.write_predictions(out_dir, split, examples, features, logits)
    return results


def write_json(path: str, value) -> None:
    atomic.write_text(path, json.dumps(value, indent=2, sort_keys=True) + "\n")


def save(workdir, params, bert_config, vocab_file, lower, task) -> str:
    path = os.path.join(workdir, "checkpoint")
    record = task.record()  # the task's head and labels: what HF export needs
    checkpoint.save_params(
        path, params, bert_config, vocab_file, lower, task=record, overwrite=True
    )
    return path


@contextlib.contextmanager
def staged_outputs(workdir: str):
    """A staging directory to write the run's outputs into (``bertjax.atomic.directory``): on
    success each entry lands in ``workdir``, ``eval_results.json`` last (an old one is removed
    first); on any failure the stage is removed and a write error is one line: nothing partial
    is left behind."""
    try:
        with atomic.directory(workdir, last=("eval_results.json",)) as stage:
            yield stage
    except (OSError, checkpoint.CheckpointError) as e:
        raise checkpoint.CheckpointError(
            f"writing the outputs into {workdir} failed ({type(e).__name__}: {e}); "
            "nothing was written"
        ) from None


def train_and_evaluate(config, workdir: str) -> dict:
    """Fine-tunes at ``config.learning_rate`` and writes everything listed in the module doc."""
    from flax.metrics import tensorboard

    task, pretrained, bert_config, vocab_file, lower, tokenizer = inputs.prepare(config)
    test_splits = inputs.existing_splits(task, config, task.test_splits)
    data = inputs.Data(task, config, tokenizer, [task.train_split, *task.dev_splits, *test_splits])
    os.makedirs(workdir, exist_ok=True)  # after reading: bad data leaves no trace in the workdir
    model = build_model(task, bert_config)
    runner = Runner(task, model, config)
    train_features = data.features[task.train_split]
    params = inputs.init_params(
        model, pretrained, train_features.arrays, jax.random.key(config.seed)
    )
    writer = tensorboard.SummaryWriter(os.path.join(workdir, "tensorboard"))
    params, final_loss = fit(
        runner,
        params,
        train_features,
        learning_rate=config.learning_rate,
        seed=config.seed,
        writer=writer,
    )
    with staged_outputs(workdir) as stage:  # checkpoint, predictions, then eval_results.json
        save(stage, params, bert_config, vocab_file, lower, task)
        out_dir = os.path.join(stage, "predictions")
        dev = evaluate_and_write(runner, task, params, data, task.dev_splits, out_dir)
        evaluate_and_write(runner, task, params, data, test_splits, out_dir, with_labels=False)
        results = _results(config, task, data, dev, final_loss)
        write_json(os.path.join(stage, "eval_results.json"), results)
    for split, values in dev.items():
        for name, value in values.items():
            if isinstance(value, int | float):
                writer.scalar(f"{split}/{name}", value, 0)
    writer.flush()
    return results


def _results(config, task, data, dev: dict, final_loss: float) -> dict:
    """What ``eval_results.json`` holds."""
    return {
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


def predict(config, workdir: str) -> list[str]:
    """Runs the fine-tuned ``workdir/checkpoint`` on the test splits present in data_dir."""
    path = config.predict_checkpoint or os.path.join(workdir, "checkpoint")
    task, params, bert_config, _, _, tokenizer = inputs.prepare(config, checkpoint_path=path)
    splits = inputs.existing_splits(task, config, task.test_splits)
    if not splits:
        names = [task.split_path(config.data_dir, s) for s in task.test_splits]
        raise FinetuneInputError(f"config.data_dir={config.data_dir!r}: none of {names} exists")
    data = inputs.Data(task, config, tokenizer, splits)
    model = build_model(task, bert_config)
    example = data.features[splits[0]].arrays
    expected = jax.eval_shape(model.init, jax.random.key(0), *model_input_specs(example))["params"]
    missing = sorted(set(expected) - set(params))
    if missing:
        raise FinetuneInputError(
            f"{path}: not a fine-tuned {task.name} checkpoint, missing {missing}"
        )
    params = inputs.init_params(model, params, data.features[splits[0]].arrays, jax.random.key(0))
    out_dir = os.path.join(workdir, "predictions")
    evaluate_and_write(
        Runner(task, model, config), task, params, data, splits, out_dir, with_labels=False
    )
    return sorted(os.listdir(out_dir))
