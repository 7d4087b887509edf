"""Fine-tuning: model from any checkpoint, training on the mesh, evaluation, predict, sweep.

``run(config, workdir)`` dispatches on ``config.mode``:

* ``train``: fine-tune on the train split, evaluate every dev split, write into ``workdir``::

      eval_results.json        {"task", "dev": {split: metrics}, "skipped": {...}, "hparams"}
                               (written last: its presence means every output is complete)
      predictions/             dev predictions + test predictions in each benchmark's format
      tensorboard/             train loss and learning rate, dev metrics
      checkpoint/              the fine-tuned params (params-only layout of
                               ``bertjax.training.checkpoint``)
      checkpoints/, bertjax_workdir.json, bert_config.json, vocab.txt, config.json,
      bertjax_lease.json       the run's train state every ``checkpoint.every_steps`` and at
                               the end, its record and lease: a training workdir, exactly as
                               pretraining's (``bertjax.training.checkpoint``)

  Training runs on the trainer core (``bertjax.training``): the same step, accumulation
  (``grad_accum_steps``), non-finite guard (``skip_nonfinite``), lease, verified checkpoints and
  SIGTERM handling as pretraining. Rerunning the command resumes bit-exact from the newest
  verified step of the same run (same task, data, checkpoint, learning rate, seed, batch size,
  length and steps; anything else is a one-line error); a finished run only re-evaluates. A
  resume takes the model, vocab and casing from the workdir's record and does not read the init
  checkpoint unless no step restores (``inputs.load_checkpoint``,
  ``bertjax.training.init_record``): it may have moved or gone.

* ``predict``: load ``workdir/checkpoint`` (or ``config.task.predict_checkpoint``) and write
  predictions for the task's test splits found in ``config.task.data_dir`` (no labels needed).
* ``sweep``: the paper's selection: every learning rate in ``config.sweep.learning_rates`` times
  ``config.sweep.num_restarts`` seeds (different shuffling and head init, same checkpoint); the
  run with the best dev ``task.primary_metric`` is kept as ``workdir/checkpoint`` and the table is
  written to ``workdir/sweep_results.{md,json}``.

The task's objective (head, loss, predictions) is ``bertjax.finetune.objective``; what the loop
feeds it is ``bertjax.finetune.inputs``.

Progress is pretraining's line (``bertjax.training.metrics.format_train_line``): after the first
step (its time includes compiling), then every ``config.train.log_every`` steps, with the loss,
learning rate, gradient norm, examples/s, real tokens/s, examples and real tokens per step (packed
rows count their examples), model GFLOP/s per device, the input wait, the host's examples per
second per core and an ETA; one line per evaluated split with its metrics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os

import jax
import ml_collections
import numpy as np

from bertjax import atomic
from bertjax.finetune import inputs, packed
from bertjax.finetune.objective import (
    Predictor,
    attention_shapes,
    build_model,
    head_rnn,
    model_input_specs,
    objective_for,
)
from bertjax.finetune.tasks import FinetuneInputError
from bertjax.training import checkpoint, compiled, kernel_check, metrics, optimizer
from bertjax.training import loop as loop_lib
from bertjax.training import sharding as sh
from bertjax.training import start as core_start
from bertjax.training.step import StepConfig


def _run_signature(config, task, learning_rate: float, seed: int, num_steps: int,
                   init_checkpoint: str) -> dict:  # fmt: skip
    """What a resumed fine-tuning run must share with the run that saved its checkpoints
    (``init_checkpoint``: the workdir's recorded one on a resume from its record)."""
    return {
        "task": task.name,
        "init_checkpoint": init_checkpoint,
        "data_dir": config.task.data_dir,
        "learning_rate": float(learning_rate),
        "seed": int(seed),
        "batch_size": int(config.train.global_batch_size),
        "max_seq_length": int(config.data.max_seq_length),
        "num_steps": int(num_steps),
        # Only when packed: the workdirs of unpacked runs resume as before.
        **({"max_sequences_per_pack": _pack_width(config)} if _pack_width(config) else {}),
        # Only with a BiLSTM head (its params are another tree), as packing.
        **({"head_rnn": _rnn_text(config)} if config.model.head_rnn != "none" else {}),
    }


def _rnn_text(config) -> str:
    model = config.model
    return f"{model.head_rnn} {model.head_rnn_size}x{model.head_rnn_layers}"


def _pack_width(config) -> int:
    """K of packed rows (``bertjax.finetune.packed``), or 0 unpacked."""
    return int(config.data.max_sequences_per_pack) if config.data.pack_sequences else 0


def _packed_batches(config, mesh, train: packed.Packed):
    """``config`` with ``batch_size`` and ``eval_batch_size`` in rows at the train split's
    examples per row (``sharding.packed_batch_sizes``, the resolver pretraining uses too)."""
    return sh.packed_batch_sizes(
        config, mesh, jax.process_count(), train.examples_per_row, unit="examples"
    )


def _check_resumed(meta: dict, signature: dict, workdir: str) -> None:
    differ = [
        f"{k} {meta['run'].get(k)!r} -> {v!r}"
        for k, v in signature.items()
        if meta["run"].get(k) != v
    ]
    if differ:
        raise FinetuneInputError(
            f"{workdir} holds the checkpoints of another fine-tuning run ({', '.join(differ)}); "
            "rerun with its settings to resume, or use a new workdir (nothing was changed)"
        )


def check_batches(config, mesh) -> None:
    """One line unless the batch sizes divide over ``mesh``'s data shards and the processes."""
    shards = sh.num_batch_shards(mesh)
    for name in ("global_batch_size", "eval_batch_size"):
        if config.train[name] % shards or config.train[name] % jax.process_count():
            raise FinetuneInputError(
                f"config.train.{name}={config.train[name]} is not divisible by {shards} data "
                f"shards (config.mesh.shape={tuple(mesh.shape.values())}) and "
                f"{jax.process_count()} processes"
            )


@dataclasses.dataclass
class Fitted:
    params: object  # global arrays in the trainer's param shardings
    final_loss: float  # mean train loss of the last logged window
    stopped: bool  # SIGTERM/Ctrl-C: saved, to be resumed
    num_steps: int
    mesh: object


def fit(config, task, model, params, train_features, *, workdir: str, learning_rate: float,
        seed: int, bert_config, vocab_file: str, lower: bool, init=None, from_record=False,
        devices=None) -> Fitted:  # fmt: skip
    """Fine-tunes host ``params`` (or what a function of none gives, called only when no step
    restores) in ``workdir`` on the trainer core, resuming from its newest verified checkpoint
    of the same run (``_run_signature``). ``init``: the run's init checkpoint for the workdir's
    record (``bertjax.training.init_record.InitRecord``, None: none); ``from_record``: the
    model, vocab and casing came from that record (``inputs.load_checkpoint``).

    Steps = features / batch_size * epochs (for SQuAD a feature is a doc-stride window), warmup
    over ``warmup_proportion`` of them, as the original run_classifier.py / run_squad.py. With
    ``config.data.pack_sequences`` the features are packed rows (``bertjax.finetune.packed``) and
    ``config``'s batch sizes count rows (``_packed_batches``).
    """
    mesh = sh.create_mesh(config.mesh.shape, devices)
    check_batches(config, mesh)
    num_steps = int(len(train_features) / config.train.global_batch_size * config.train.num_epochs)
    opt_config = ml_collections.ConfigDict(config.optimizer.to_dict())
    opt_config.learning_rate = float(learning_rate)
    opt_config.warmup_steps = int(num_steps * config.optimizer.warmup_proportion)
    example = train_features.arrays
    model = _checked(task, model, example, mesh, _pack_width(config))
    objective = objective_for(task, model, example, mesh, _pack_width(config))
    train_batch = {
        k: jax.ShapeDtypeStruct((config.train.global_batch_size, *v.shape[1:]), v.dtype)
        for k, v in example.items()
    }
    if "instance_weights" not in train_batch:  # unpacked rows: one example each
        rows = config.train.global_batch_size
        train_batch["example_weights"] = jax.ShapeDtypeStruct((rows,), np.float32)
    source = config.init_checkpoint if init is None else init.source
    signature = _run_signature(config, task, learning_rate, seed, num_steps, source)
    tokens = int(np.prod(example["input_ids"].shape[1:]))
    choices = tokens // int(example["input_ids"].shape[-1])
    report = loop_lib.Report(
        tokens_per_row=tokens,
        flops_per_row=3.0 * choices * metrics.encoder_flops(bert_config, tokens // choices),
    )
    run = Run(workdir=workdir, signature=signature, seed=seed, bert_config=bert_config,
              vocab_file=vocab_file, lower=lower, report=report)  # fmt: skip
    return train(config, objective, train_batch, train_features, mesh, opt_config, num_steps, run,
                 initial_params=params if callable(params) else lambda: params, init=init,
                 from_record=from_record)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Run:
    """Who a fine-tuning run on the trainer core is: its workdir, what a resume must share with
    it (``signature``, checked against a restored step's meta), its seed (dropout and batch
    order), the model and vocab of its record, and how its console lines count work."""

    workdir: str
    signature: dict
    seed: int
    bert_config: object
    vocab_file: str
    lower: bool
    report: loop_lib.Report


def train(config, objective, train_batch: dict, train_features, mesh, opt_config,
          num_steps: int, run: Run, *, initial_params=lambda: None, init=None,
          from_record=False) -> Fitted:  # fmt: skip
    """The one fine-tuning training run on the trainer core, for a model (:func:`fit`) and for a
    head on stored activations (``bertjax.finetune.feature_based``): builds the step for
    ``train_batch`` (abstract, global), starts (restores the newest verified step of the same
    ``run.signature``, or ``initial_params``), runs ``num_steps`` over ``train_features`` with
    ``config``'s log and save cadence and returns what it trained."""
    trainer = compiled.build_trainer(
        objective,
        optimizer.create_optimizer(opt_config, num_steps),
        optimizer.learning_rate_schedule(opt_config, num_steps),
        StepConfig(int(config.train.grad_accum_steps), bool(config.train.skip_nonfinite)),
        mesh,
        config.mesh.rules,
        train_batch,
    )
    key = jax.random.key(run.seed)  # fold_in(key, step) per update, as pretraining's
    plan = core_start.Plan(
        bert_config=run.bert_config, vocab_file=run.vocab_file, do_lower_case=run.lower,
        config_json=config.to_json_best_effort(), allow_vocab_change=False,
        keep=config.checkpoint.keep, async_save=bool(config.checkpoint.async_save),
        keep_every=config.checkpoint.keep_every,
        lease_ttl_seconds=float(config.checkpoint.lease_ttl_seconds),
        lease_renew_seconds=float(config.checkpoint.lease_renew_seconds),
        init_rng=key, rng_data=np.asarray(jax.random.key_data(key)),
        initial_params=initial_params,
        check_meta=lambda meta: _check_resumed(meta, run.signature, run.workdir),
        init=init, from_record=from_record,
    )  # fmt: skip
    started = core_start.start(run.workdir, plan, trainer)
    cadence = loop_lib.Cadence(
        num_steps=num_steps,
        log_every=int(config.train.log_every),
        eval_every=0,
        save_every=int(config.checkpoint.every_steps),
        skip_nonfinite=bool(config.train.skip_nonfinite),
    )
    last_loss = (started.meta or {}).get("train_loss", float("nan"))
    loop = loop_lib.Loop(
        trainer, started, run.workdir, cadence, run.report,
        peak_flops=float(config.train.peak_flops),
        meta=lambda step: {"step": step, "run": run.signature, "train_loss": loop.summary.get(
            "train", {}).get("loss", last_loss)},
    )  # fmt: skip
    batches = inputs.train_batches(
        train_features, int(config.train.global_batch_size), num_steps, run.seed,
        start_batch=int(started.state.step),
    )  # fmt: skip
    try:
        summary = loop.run(started.state, batches)
    finally:
        loop.close()
    final_loss = float(summary.get("train", {}).get("loss", last_loss))
    state = summary.get("state")
    return Fitted(
        None if state is None else state.params, final_loss, summary["stopped"], num_steps, mesh
    )


def _metrics_text(values: dict) -> str:
    return " ".join(
        f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
        for k, v in values.items()
        if isinstance(v, int | float)
    )


# ---- orchestration ------------------------------------------------------------------------------


def evaluate_and_write(predictor, task, params, data, splits, out_dir, with_labels=True):
    """Runs the model on ``splits``; returns {split: metrics} (labelled splits only)."""
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    results = {}
    for split in splits:
        examples, features = data.examples[split], data.features[split]
        logits = predictor.logits(params, features)
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
    """Fine-tunes at ``config.optimizer.learning_rate`` and writes everything listed in the
    module doc; after SIGTERM/Ctrl-C it has saved its state and returns {"stopped": step}
    instead."""
    task, pretrained, bert_config, vocab_file, lower, tokenizer = inputs.prepare(
        config, workdir=workdir
    )
    rnn = head_rnn(config, bert_config)  # a bad head_rnn fails before the data is read
    test_splits = inputs.existing_splits(task, config, task.test_splits)
    data = inputs.Data(task, config, tokenizer, [task.train_split, *task.dev_splits, *test_splits])
    model = build_model(task, bert_config, rnn)
    train_features = data.features[task.train_split]
    params, init = inputs.initial_params(
        model, pretrained, train_features.arrays, jax.random.key(config.seed), workdir
    )
    run_config, train_rows = pack_train(config, task, train_features)
    fitted = fit(
        run_config, task, model, params, train_rows, workdir=workdir,
        learning_rate=config.optimizer.learning_rate, seed=config.seed, bert_config=bert_config,
        vocab_file=vocab_file, lower=lower, init=init, from_record=pretrained.from_record,
    )  # fmt: skip
    if fitted.stopped:
        print(f"stopped: rerun the same command to resume in {workdir}", flush=True)
        return {"stopped": True}
    predictor = predictor_for(run_config, task, model, train_features.arrays, fitted.mesh)
    with staged_outputs(workdir) as stage:  # checkpoint, predictions, then eval_results.json
        save(stage, fitted.params, bert_config, vocab_file, lower, task)
        out_dir = os.path.join(stage, "predictions")
        dev = evaluate_and_write(predictor, task, fitted.params, data, task.dev_splits, out_dir)
        evaluate_and_write(
            predictor, task, fitted.params, data, test_splits, out_dir, with_labels=False
        )
        results = _results(config, task, data, dev, fitted.final_loss)
        write_json(os.path.join(stage, "eval_results.json"), results)
    writer = metrics.summary_writer(os.path.join(workdir, "tensorboard"))
    writer.write_scalars(
        fitted.num_steps,
        {
            f"{split}/{name}": value
            for split, values in dev.items()
            for name, value in values.items()
            if isinstance(value, int | float)
        },
    )
    writer.close()
    return results


def pack_train(config, task, train_features):
    """(config, the features fit() trains on): unchanged, or with ``config.data.pack_sequences`` the
    split packed and the batch sizes in rows (``_packed_batches``)."""
    packed.check(config, task.head)
    if not _pack_width(config):
        return config, train_features
    rows = packed.pack(train_features, task.head, _pack_width(config))
    mesh = sh.create_mesh(config.mesh.shape)
    return _packed_batches(config, mesh, rows), rows.features


def _checked(task, model, example: dict, mesh, pack: int):
    """``model`` with the attention kernel its self-check decides at the run's shapes, on the
    run's devices, before a step is built (``bertjax.training.kernel_check``)."""
    shapes = attention_shapes(task, example, pack, model.config, model.rnn)
    fitted = sh.bert_config_for(model.config, mesh)
    return model.clone(config=kernel_check.checked(fitted, mesh, shapes))


def predictor_for(run_config, task, model, example: dict, mesh) -> Predictor:
    """The Predictor of a run (``run_config``: its batch sizes in rows when packed)."""
    model = _checked(task, model, example, mesh, _pack_width(run_config))
    objective = objective_for(task, model, example, mesh, _pack_width(run_config))
    return Predictor(objective, mesh, run_config.mesh.rules, run_config.train.eval_batch_size)


def _results(config, task, data, dev: dict, final_loss: float) -> dict:
    """What ``eval_results.json`` holds."""
    return {
        "task": task.name,
        "dev": dev,
        "final_train_loss": final_loss,
        "skipped": {s: f.skipped for s, f in data.features.items() if f.skipped},
        "hparams": {
            "learning_rate": config.optimizer.learning_rate,
            "batch_size": config.train.global_batch_size,
            "num_train_epochs": config.train.num_epochs,
            "seed": config.seed,
            "max_sequences_per_pack": _pack_width(config),  # 0: unpacked
        },
    }


def predict(config, workdir: str) -> list[str]:
    """Runs the fine-tuned ``workdir/checkpoint`` on the test splits present in data_dir;
    -> the names of the files written into ``workdir/predictions``."""
    path = config.task.predict_checkpoint or os.path.join(workdir, "checkpoint")
    task, pretrained, bert_config, _, _, tokenizer = inputs.prepare(config, checkpoint_path=path)
    params = pretrained.params()
    rnn = head_rnn(config, bert_config)
    splits = inputs.existing_splits(task, config, task.test_splits)
    if not splits:
        names = [task.split_path(config.task.data_dir, s) for s in task.test_splits]
        raise FinetuneInputError(
            f"config.task.data_dir={config.task.data_dir!r}: none of {names} exists"
        )
    data = inputs.Data(task, config, tokenizer, splits)
    model = build_model(task, bert_config, rnn)
    example = data.features[splits[0]].arrays
    expected = jax.eval_shape(model.init, jax.random.key(0), *model_input_specs(example))["params"]
    missing = sorted(set(expected) - set(params))
    if ("bilstm" in params) != ("bilstm" in expected):  # its head is not the config's
        raise FinetuneInputError(
            f"{path}: {'a' if 'bilstm' in params else 'no'} BiLSTM head (params 'bilstm'), but "
            f"config.model.head_rnn={config.model.head_rnn!r}: predict with the training run's "
            "head_rnn, head_rnn_size and head_rnn_layers"
        )
    if missing:
        raise FinetuneInputError(
            f"{path}: not a fine-tuned {task.name} checkpoint, missing {missing}"
        )
    params = inputs.init_params(model, params, example, jax.random.key(0))
    mesh = sh.create_mesh(config.mesh.shape)
    check_batches(config, mesh)
    packed.check(config, task.head)
    run_config = config
    if _pack_width(config):  # eval rows at the first split's examples per row
        first = packed.pack(data.features[splits[0]], task.head, _pack_width(config))
        run_config = _packed_batches(config, mesh, first)
    predictor = predictor_for(run_config, task, model, example, mesh)
    # Staged, then merged file by file into workdir/predictions: the train run's dev
    # predictions stay, and a failure leaves the old files (bertjax.atomic.directory).
    with atomic.directory(os.path.join(workdir, "predictions")) as stage:
        evaluate_and_write(predictor, task, params, data, splits, stage, with_labels=False)
        written = sorted(os.listdir(stage))
    return written
