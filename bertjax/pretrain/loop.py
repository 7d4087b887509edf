"""The pretraining run, ``train_and_evaluate(config, workdir)``: the host side of pretraining.

A run: take the architecture, vocab and initial params from ``config.init_checkpoint`` when it is
set, or on a resume from the workdir's record, reading the checkpoint only if no step restores
(``bertjax.pretrain.continued``) -> check the config and data (``bertjax.pretrain.inputs``) ->
check the fused attention kernel on the devices at the run's shapes
(``bertjax.training.kernel_check``) -> build the abstract state, its shardings and the jitted
steps (``bertjax.pretrain.objective.build_steps``) -> take the workdir and restore or initialise the
state (``bertjax.training.start``; nothing is written before the run is accepted) -> the trainer
core's loop (``bertjax.training.loop``: stepping, logging, checkpoints, preemption, the
non-finite policy) with pretraining's data and evaluation.

- **Restore order**: this workdir's newest verified checkpoint -> ``config.init_checkpoint``
  (its params, fresh heads where it has none, a fresh optimizer state) -> fresh init (layout in
  ``bertjax.training.checkpoint``).
- **Data position**: a checkpoint stores the step, the data stream's signature and the steps
  taken on it; a resumed run on the same stream continues exactly where it stopped, a run whose
  data changed starts the new stream from its beginning. The stream is read in units of the
  batch schedule (``bertjax.training.batch_schedule``: the full batch, or with a batch-size
  warm-up the gcd of its sizes), so the position stays exact across a change of batch size.
- **Evaluation** every ``train.eval_every`` steps and at the end: at most ``train.eval_steps``
  batches of the held-out split, MLM/NSP loss and accuracy.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from bertjax.data.pipeline import HOST_SECONDS
from bertjax.pretrain import continued as continued_lib
from bertjax.pretrain import inputs
from bertjax.pretrain import objective as objective_lib
from bertjax.pretrain import start as start_lib
from bertjax.pretrain.objective import BATCH_KEYS, PACKED_KEYS
from bertjax.training import batch_schedule, kernel_check
from bertjax.training import loop as loop_lib
from bertjax.training import metrics as metrics_lib
from bertjax.training import sharding as sh
from bertjax.training import start as core_start
from bertjax.training.batch_schedule import BatchSchedule


def _evaluate(config, bert_config, eval_fn, params) -> dict:
    acc = metrics_lib.Accumulator()
    per_host = int(config.train.eval_batch_size) // jax.process_count()
    batches = inputs.host_batches(config, bert_config, split="eval", batch_size=per_host)
    for batch in itertools.islice(batches, int(config.train.eval_steps)):
        batch = {k: batch[k] for k in (*BATCH_KEYS, *PACKED_KEYS, "example_weight") if k in batch}
        batch.setdefault("example_weight", np.ones(per_host, np.float32))
        acc.add(jax.device_get(eval_fn(params, sh.make_global_batch(batch, eval_fn.mesh))))
    return objective_lib.summarize_eval(acc.sums, objective_lib.has_nsp(config)) if acc.sums else {}


def _train_batches(config, bert_config, schedule: BatchSchedule, step: int, offset: int):
    """This process's train batches for the steps from ``step`` on, on the stream that started
    at step ``offset``: host batches of the schedule's unit from the unit the stream is at, as
    many concatenated as the step's size takes (``bertjax.training.batch_schedule``); the first
    is checked against the config (TFRecords may disagree with it), every one cut to the step's
    keys."""
    per_host = schedule.unit // jax.process_count()
    start = schedule.units_before(step) - schedule.units_before(offset)
    units = inputs.host_batches(
        config, bert_config, split="train", batch_size=per_host, start_batch=start
    )
    keys = (*BATCH_KEYS, *PACKED_KEYS)
    for index, first in enumerate(units):
        if index == 0:
            inputs.check_batch(first, config, per_host)
        parts = [first, *itertools.islice(units, schedule.size(step) // schedule.unit - 1)]
        # example_weight: eval only; host_seconds: for the loop's host rate
        batch = {k: np.concatenate([p[k] for p in parts]) for k in keys if k in first}
        if HOST_SECONDS in first:
            batch[HOST_SECONDS] = sum(float(p[HOST_SECONDS]) for p in parts)
        step += 1
        yield batch


def _report(config, bert_config) -> loop_lib.Report:
    length, predictions = int(config.data.max_seq_length), int(config.data.max_predictions_per_seq)
    nsp = objective_lib.has_nsp(config)
    return loop_lib.Report(
        tokens_per_row=length,
        flops_per_row=metrics_lib.train_flops_per_sequence(bert_config, length, predictions),
        summarize=functools.partial(objective_lib.summarize, nsp=nsp),
        short_names=objective_lib.SHORT_NAMES if nsp else objective_lib.SHORT_NAMES[:2],
    )


def train_and_evaluate(config, workdir: str, command_line: Mapping[str, Any] | None = None) -> dict:
    """Pretrains per ``config`` in ``workdir`` (resuming if it holds a checkpoint).

    ``command_line``: the config keys the command line set (dotted, e.g. ``model.hidden_size``)
    with their values; with ``config.init_checkpoint`` a model field among them must agree with
    the checkpoint and a ``data.vocab_file`` is checked against its vocab
    (``bertjax.pretrain.continued``). Returns the final summary dict (last train window and eval
    values). Raises ValueError for a config that cannot work, FloatingPointError on a non-finite
    step (unless skipping).
    """
    config, continued = continued_lib.resolve(config, command_line or {}, workdir)
    bert_config = objective_lib.bert_config_from(config)
    mesh = sh.create_mesh(config.mesh.shape)
    config = inputs.resolve_packed_batch(config, mesh, jax.process_count())
    inputs.check_config(config, bert_config, mesh, jax.process_count())
    inputs.check_data(config, bert_config)
    schedule = batch_schedule.on_mesh(config, mesh, jax.process_count())
    if schedule.sizes and jax.process_index() == 0:
        print(schedule.describe(int(config.train.num_steps)), flush=True)
    shapes = objective_lib.attention_shapes(config, bert_config)
    checked = kernel_check.checked(sh.bert_config_for(bert_config, mesh), mesh, shapes)
    steps = objective_lib.build_steps(config, mesh, checked, schedule)
    started = core_start.start(workdir, start_lib.plan(config, steps, continued), steps.trainer)
    del continued  # its host params are on the devices now, or unused by a resumed run
    meta, signature = started.meta, inputs.data_signature(config, schedule=schedule)
    start_step = int(started.state.step)
    # Data offset: the step at which the current stream started (0 unless the data changed).
    same_stream = meta and inputs.same_stream(meta["data_signature"], signature, config, schedule)
    offset = start_step - meta["data_position"] if same_stream else start_step
    cadence = loop_lib.Cadence(
        num_steps=int(config.train.num_steps),
        log_every=int(config.train.log_every),
        eval_every=int(config.train.eval_every),
        save_every=int(config.checkpoint.every_steps),
        skip_nonfinite=bool(config.train.skip_nonfinite),
    )
    loop = loop_lib.Loop(
        steps.trainer,
        started,
        workdir,
        cadence,
        _report(config, bert_config),
        peak_flops=float(config.train.peak_flops),
        evaluate=lambda params: _evaluate(config, bert_config, steps.eval_step, params),
        meta=lambda step: {
            "step": step, "data_signature": signature, "data_position": step - offset
        },
    )  # fmt: skip
    try:
        batches = _train_batches(config, bert_config, schedule, start_step, offset)
        summary = loop.run(started.state, batches)
    finally:
        loop.close()
    if not summary.pop("stopped"):
        loop_lib.print_summary(summary)
    summary.pop("state", None)
    return summary
