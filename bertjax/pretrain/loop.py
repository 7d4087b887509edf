"""The pretraining run, ``train_and_evaluate(config, workdir)``: the host side of training.

A run: check the config and data (``bertjax.pretrain.inputs``) -> build the abstract state, its
shardings and the jitted steps (``bertjax.pretrain.step.build_steps``) -> take the workdir and
restore or initialise the state (``bertjax.pretrain.start``: nothing is written before the run
is accepted) -> loop: step; log every ``train.log_every`` steps; evaluate every
``train.eval_every``; save every ``checkpoint.every_steps`` and at the end.

Host policies (the step itself is pure; its contract is in ``bertjax.pretrain.step``):

- **Restore order**: this workdir's newest verified checkpoint -> ``config.init_checkpoint``
  (params only) -> fresh init (layout in ``bertjax.training.checkpoint``).
- **Data position**: a checkpoint stores the step, the data stream's signature and the batches
  consumed from it; a resumed run on the same stream continues exactly where it stopped, a run
  whose data changed starts the new stream from its beginning.
- **Metrics** are fetched one step late so the host never waits for the device, except at a log,
  eval or save boundary, where a non-finite step must be caught before anything is written.
- **Non-finite** loss or gradient: without ``train.skip_nonfinite`` the loop raises
  FloatingPointError naming the step before it logs, evaluates or saves; with it the step has
  kept the old state and the loop only warns (the state counts the skips).
- **Stopping**: SIGTERM (preemption) or SIGINT (Ctrl-C) on any host -> all hosts agree, save the
  current step, return (exit 0); a second signal stops at once without saving. Before the loop
  starts, the command's own handler turns a signal into a one-line stop (``bertjax.main``).
- **Failures that stop the run with one line** (and no further step): a background save that
  failed (e.g. a full disk; the last complete checkpoint stays restorable), a lost lease.
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
from bertjax.pretrain import start as start_lib
from bertjax.pretrain import step as step_lib
from bertjax.pretrain.step import BATCH_KEYS
from bertjax.training import accelerators, lease
from bertjax.training import metrics as metrics_lib
from bertjax.training import sharding as sh


class _Stop:
    """SIGTERM (Cloud TPU maintenance, spot preemption) or SIGINT (Ctrl-C): save the current step
    and return; a second signal raises KeyboardInterrupt at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.requested = ""  # the signal's name
        self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

    def _handle(self, signum, frame):
        del frame
        if self.requested:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopped without saving")
        self.requested = signal.Signals(signum).name

    def agreed(self, lease_lost: bool) -> tuple[bool, bool]:
        """(stop requested, lease lost) agreed by all hosts: any host's stops every host."""
        flags = np.asarray([bool(self.requested), lease_lost], np.int32)
        if jax.process_count() > 1:
            flags = np.any(multihost_utils.process_allgather(flags), axis=0)
        return bool(flags[0]), bool(flags[1])

    def restore(self):
        for s, previous in self._previous.items():
            signal.signal(s, previous)


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
    steps = step_lib.build_steps(config, mesh)
    started = start_lib.start(config, workdir, steps)
    state, rng_data, meta = started.state, started.rng_data, started.meta
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
    loop = _Loop(config, workdir, bert_config, started, signature, offset)
    try:
        return loop.run(state, step_fn, eval_fn, rng, batches, mesh)
    finally:
        loop.close()


class _Loop:
    """The host side of training: stepping, logging, eval, checkpoints, preemption, NaN policy."""

    def __init__(self, config, workdir, bert_config, started: start_lib.Start, signature, offset):
        self.config, self.signature, self.offset = config, signature, offset
        self.checkpoints, self.held, self.rng_data = (
            started.checkpoints,
            started.held,
            started.rng_data,
        )
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
        self.stop = _Stop()
        self.window = metrics_lib.Accumulator()
        self.summary: dict = {}
        self.last_saved = -1

    def run(self, state, step_fn, eval_fn, rng, batches, mesh) -> dict:
        config, step = self.config, int(state.step)
        self.last_saved = step if self.checkpoints.latest_step() == step else -1
        first, pending, started = True, None, time.perf_counter()
        start_step = step
        while step < self.num_steps:
            requested, lease_lost = self.stop.agreed(self.held is not None and self.held.lost)
            if lease_lost:
                raise lease.LeaseError(
                    f"{self.checkpoints.root}: this run lost its lease to another run at step "
                    f"{step}; it stopped without saving"
                )
            if requested:
                if jax.process_index() == 0:
                    print(f"{self.stop.requested or 'stop'}: saving step {step}", flush=True)
                break
            self.checkpoints.check_for_errors()  # a failed background save stops the run
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
        self.checkpoints.finish()
        if self.stop.requested:
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
            self.checkpoints.finish()
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
        if self.held is not None:
            self.held.check()  # LeaseError (one line) when another run took the workdir
        meta = {"step": step, "data_signature": self.signature, "data_position": step - self.offset}
        self.checkpoints.save(step, state, self.rng_data, meta)
        self.last_saved = step

    def close(self) -> None:
        self.stop.restore()
        self.writer.close()
        self.checkpoints.close()
        if self.held is not None:
            self.held.release()
