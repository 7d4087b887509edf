"""The pretraining run, ``train_and_evaluate(config, workdir)``: the host side of training.

A run: check the config and data (``bertjax.pretrain.inputs``) -> build the abstract state and its
shardings (``bertjax.pretrain.step``) -> restore or initialise it -> jit the train and eval steps
once -> loop: step; log every ``train.log_every`` steps; evaluate every ``train.eval_every``; save
every ``checkpoint.every_steps`` and at the end.

Host policies (the step itself is pure; its contract is in ``bertjax.pretrain.step``):

- **Restore order**: this workdir's latest checkpoint -> ``config.init_checkpoint`` (params only)
  -> fresh init (layout in ``bertjax.training.checkpoint``).
- **Data position**: a checkpoint stores the step, the data stream's signature and the batches
  consumed from it; a resumed run on the same stream continues exactly where it stopped, a run
  whose data changed starts the new stream from its beginning.
- **Metrics** are fetched one step late so the host never waits for the device, except at a log,
  eval or save boundary, where a non-finite step must be caught before anything is written.
- **Non-finite** loss or gradient: without ``train.skip_nonfinite`` the loop raises
  FloatingPointError naming the step before it logs, evaluates or saves; with it the step has
  kept the old state and the loop only warns (the state counts the skips).
- **Preemption**: SIGTERM on any host -> all hosts agree, save the current step, return (exit 0).
- **MFU** = model FLOPs per second (``metrics.train_flops_per_sequence``, bidirectional attention
  counted in full) / the devices' peak: ``train.peak_flops`` if set, else the table's peak of a
  known TPU/GPU, else the measured fp32 matmul ceiling (CPU); which one is printed once at start.
"""

from __future__ import annotations

import itertools
import json
import signal
import time

import jax
import numpy as np
from absl import logging
from etils import epath
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from bertjax.pretrain import inputs
from bertjax.pretrain import step as step_lib
from bertjax.pretrain.step import BATCH_KEYS
from bertjax.training import accelerators, checkpoint
from bertjax.training import metrics as metrics_lib
from bertjax.training import sharding as sh


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
    state = step_lib.init_train_state(model, tx, shardings, init_rng, length, predictions, params)
    return state, np.asarray(jax.random.key_data(train_rng)), None


def _evaluate(config, bert_config, eval_fn, params) -> dict:
    acc = metrics_lib.Accumulator()
    per_host = int(config.train.eval_batch_size) // jax.process_count()
    batches = inputs.host_batches(config, bert_config, split="eval", batch_size=per_host)
    for batch in itertools.islice(batches, int(config.train.eval_steps)):
        batch = {k: batch[k] for k in (*BATCH_KEYS, "example_weight") if k in batch}
        batch.setdefault("example_weight", np.ones(per_host, np.float32))
        acc.add(jax.device_get(eval_fn(params, sh.make_global_batch(batch, eval_fn.mesh))))
    return metrics_lib.summarize_eval(acc.sums) if acc.sums else {}


def train_and_evaluate(config, workdir: str) -> dict:
    """Pretrains per ``config`` in ``workdir`` (resuming if it holds a checkpoint).

    Returns the final summary dict (last train window and eval values). Raises ValueError for a
    config that cannot work, FloatingPointError on a non-finite step (unless skipping).
    """
    bert_config = step_lib.bert_config_from(config)
    mesh = sh.create_mesh(config.mesh.shape)
    inputs.check_config(config, bert_config, mesh, jax.process_count())
    inputs.check_data(config, bert_config)
    length, predictions = int(config.data.max_seq_length), int(config.data.max_predictions_per_seq)
    steps = step_lib.build_steps(config, mesh)
    model, tx = steps.model, steps.tx
    abstract, shardings = steps.abstract_state, steps.state_shardings
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
    signature = inputs.data_signature(config)
    start_step = int(state.step)
    # Data offset: the step at which the current stream started (0 unless the data changed).
    same_stream = meta and meta["data_signature"] == signature
    offset = start_step - meta["data_position"] if same_stream else start_step
    step_fn, eval_fn = steps.train_step, steps.eval_step
    rng = sh.put_global(rng_data, NamedSharding(mesh, PartitionSpec()))
    batches = inputs.host_batches(
        config,
        bert_config,
        split="train",
        batch_size=int(config.train.global_batch_size) // jax.process_count(),
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
        self.peak, source = accelerators.peak_flops_per_device(
            float(config.train.peak_flops), jax.devices()[0].device_kind
        )
        if jax.process_index() == 0:
            print(f"mfu: {source}", flush=True)
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
                per_host = int(config.train.global_batch_size) // jax.process_count()
                inputs.check_batch(host_batch, config, per_host)
                first = False
            host_batch = {k: host_batch[k] for k in BATCH_KEYS}  # example_weight: eval only
            state, step_metrics = step_fn(state, sh.make_global_batch(host_batch, mesh), rng)
            step += 1
            # Fetched one step late (module docstring), except at a boundary.
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
        return self._finish(step, state, eval_fn)

    def _finish(self, step: int, state, eval_fn) -> dict:
        self._save(step, state)
        self.manager.wait_until_finished()
        if self.preemption.requested:
            return self.summary
        if int(self.config.train.eval_every) and self.summary.get("eval_step") != step:
            self._eval(step, eval_fn, state.params)
        self.summary["nonfinite_skips"] = int(state.nonfinite_skips)
        self.summary["step"] = step
        if jax.process_index() == 0:
            summary = json.dumps(self.summary, sort_keys=True, default=float)
            print(f"final summary: {summary}", flush=True)
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
            num_devices=jax.device_count(),
            peak_flops_per_device=self.peak,
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
