"""The trainer core's host loop, shared by pretraining and fine-tuning.

``Loop.run(state, batches)`` steps until ``Cadence.num_steps``; logs after its first step (whose
time includes compiling), every ``log_every`` steps and at the end (one console line and
TensorBoard scalars, ``bertjax.training.metrics``), evaluates every
``eval_every`` (through the run's ``evaluate`` callback), saves every ``save_every`` and at the
end. What it was given by ``bertjax.training.start`` (the restored state, the checkpoints, the
lease) it closes in :meth:`Loop.close`.

Host policies (the step itself is pure; its contract is ``bertjax.training.step``):

- **Metrics** are fetched one step late so the host never waits for the device, except at a log,
  eval or save boundary, where a non-finite step must be caught before anything is written.
- **Non-finite** loss or gradient: without ``skip_nonfinite`` the loop raises FloatingPointError
  naming the step before it logs, evaluates or saves; with it the step has kept the old state
  and the loop only warns (the state counts the skips).
- **Stopping**: SIGTERM (preemption) or SIGINT (Ctrl-C) -> save the current step, return (exit
  0); a second signal stops at once without saving. One process handles both signals itself.
  Several processes agree on the step to stop at through JAX's distributed runtime, with no
  device collective and nothing per step but a local check (``bertjax.training.preemption``).
- **Failures that stop the run with one line** (and no further step): a background save that
  failed (e.g. a full disk; the last complete checkpoint stays restorable); a lost lease, which
  the processes agree on at each log, eval and save boundary, before anything is written (one
  broadcast from process 0, which holds the lease), never per step.
- **Dispatch runs ahead**: the loop blocks on the device only to fetch the metrics of the step
  before the one it just dispatched (and at a log, eval or save boundary), so the device always
  has the next step queued (``bench/dispatch_bench.py`` counts it).
- **Input wait**: the share of the window's wall time the loop spent getting the next host
  batch (``next(batches)`` and placing it on the mesh), in the line (``input_wait``) and in
  TensorBoard (``train/input_wait``). Above ``INPUT_BOUND`` in ``INPUT_BOUND_WINDOWS``
  consecutive windows (the first, which includes compiling, aside) it warns once, in one line:
  the run is input-bound, the host pipeline is slower than the step.
- **Host rate**: the host pipeline's own throughput, rows per second of its own work, from the
  ``host_seconds`` each batch carries (the batch contract, ``bertjax.data.pipeline``), which the
  loop takes out before the step: ``host_rate`` (rows/s per busy host core) and ``host_cores``
  (the cores that work takes at the window's step rate) in TensorBoard, ``host N/s/core`` in the
  line. It counts this process's rows and work; process 0 prints it. Batches without
  ``host_seconds`` (synthetic data) show neither.
- **MFU** = model FLOPs per second (``Report.flops_per_row``) / the devices' peak
  (``train.peak_flops`` if set, else the table's peak of a known TPU/GPU); which one is printed
  once at start.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator

import jax
import numpy as np
from absl import logging
from etils import epath
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from bertjax.data.pipeline import HOST_SECONDS
from bertjax.training import accelerators, lease, preemption
from bertjax.training import metrics as metrics_lib
from bertjax.training import sharding as sh
from bertjax.training.compiled import Trainer
from bertjax.training.start import Started

INPUT_BOUND, INPUT_BOUND_WINDOWS = 0.10, 3


@dataclasses.dataclass(frozen=True)
class Cadence:
    num_steps: int  # the run stops after this many updates
    log_every: int
    eval_every: int  # 0 = never (no evaluate callback either)
    save_every: int
    skip_nonfinite: bool


@dataclasses.dataclass(frozen=True)
class Report:
    """What the progress line and TensorBoard show besides loss, rates and the ETA."""

    tokens_per_row: int
    flops_per_row: float  # model FLOPs of one row's forward and backward
    summarize: Callable[[dict], dict] = lambda sums: {}  # the objective's window metrics
    short_names: tuple[tuple[str, str], ...] = ()  # (metric, its name in the console line)


class Loop:
    """The host side of training: stepping, logging, eval, checkpoints, preemption, NaN policy."""

    def __init__(
        self,
        trainer: Trainer,
        started: Started,
        workdir: str,
        cadence: Cadence,
        report: Report,
        *,
        peak_flops: float = 0.0,
        evaluate: Callable[[object], dict] | None = None,
        meta: Callable[[int], dict] = lambda step: {"step": step},
    ):
        self.trainer, self.cadence, self.report = trainer, cadence, report
        self.checkpoints, self.held = started.checkpoints, started.held
        self.rng_data, self.evaluate, self.meta = started.rng_data, evaluate, meta
        self.peak, source = accelerators.peak_flops_per_device(
            float(peak_flops), jax.devices()[0].device_kind
        )
        if jax.process_index() == 0:
            print(f"mfu: {source}", flush=True)
        self.writer = metrics_lib.summary_writer(str(epath.Path(workdir) / "tensorboard"))
        self.stop = preemption.Preemption()
        self.window = metrics_lib.Accumulator()
        self.summary: dict = {}
        self.last_saved = -1
        self.last_lr = float("nan")
        self.eta_from: tuple[int, float] | None = None  # (step, time) of the first line
        self.input_bound_windows = 0  # consecutive windows above INPUT_BOUND (-1: warned)

    def run(self, state, batches: Iterator[dict]) -> dict:
        """Trains ``state`` on host ``batches`` (this process's rows of each global batch)."""
        mesh, step = self.trainer.mesh, int(state.step)
        rng = sh.put_global(self.rng_data, NamedSharding(mesh, PartitionSpec()))
        self.last_saved = step if self.checkpoints.latest_step() == step else -1
        pending, start_step = None, step
        while step < self.cadence.num_steps:
            if self._should_stop(step):
                break
            self.checkpoints.check_for_errors()  # a failed background save stops the run
            waited = time.perf_counter()
            host_batch = next(batches)
            self.window.add_host_batch(host_batch.pop(HOST_SECONDS, None), host_batch)
            batch = sh.make_global_batch(host_batch, mesh)
            self.window.input_wait += time.perf_counter() - waited
            state, step_metrics = self.trainer.train_step(state, batch, rng)
            step += 1
            # Fetched one step late (module docstring), except at a boundary.
            if pending is not None:
                self._record(*pending)
            pending = (step, step_metrics, len(next(iter(batch.values()))))  # global rows
            log = (
                step % self.cadence.log_every == 0
                or step in (start_step + 1, self.cadence.num_steps)  # after compiling; the end
            )
            evaluate = self.cadence.eval_every and step % self.cadence.eval_every == 0
            save = step % self.cadence.save_every == 0
            if log or evaluate or save:
                self._record(*pending)
                pending = None
                self._check_lease(step)  # before the line's TensorBoard scalars, eval, save
            if log:
                self._log(step)
            if evaluate:
                self._eval(step, state.params)
            if save:
                self._save(step, state)
        if pending is not None:
            self._record(*pending)
        return self._finish(step, state)

    def _should_stop(self, step: int) -> bool:
        if not self.stop.reached():
            return False
        if jax.process_index() == 0:
            print(f"{self.stop.reason()}: saving step {step}", flush=True)
        return True

    def _check_lease(self, step: int) -> None:
        """LeaseError on every process when process 0 (the holder) lost the lease: agreed by one
        broadcast, so call it only where every process does (log, eval and save boundaries)."""
        lost = self.held is not None and self.held.lost
        if jax.process_count() > 1:
            lost = bool(multihost_utils.broadcast_one_to_all(np.int32(lost)))
        if not lost:
            return
        if self.held is not None:
            self.held.check()  # names who took it
        raise lease.LeaseError(
            f"{self.checkpoints.root}: this run lost its lease to another run at step {step} "
            "(process 0 holds it); it stopped without saving"
        )

    def _finish(self, step: int, state) -> dict:
        self._save(step, state)
        self.checkpoints.finish()
        self.summary["stopped"] = self.stop.stopped
        if self.stop.stopped:
            return self.summary
        if self.cadence.eval_every and self.summary.get("eval_step") != step:
            self._eval(step, state.params)
        self.summary["nonfinite_skips"] = int(state.nonfinite_skips)
        self.summary["step"] = step
        self.summary["state"] = state
        return self.summary

    def _record(self, step: int, step_metrics, rows: int) -> None:
        values = jax.device_get(step_metrics)
        if values["nonfinite"] and not self.cadence.skip_nonfinite:
            self.checkpoints.finish()
            raise FloatingPointError(
                f"non-finite loss or gradient at step {step} (loss={float(values['loss_sum'])}, "
                f"grad_norm={float(values['grad_norm_sum'])}); the update was not applied and no "
                "checkpoint was written for it (set skip_nonfinite to skip such updates)"
            )
        if values["nonfinite"]:
            logging.warning("skipped the update of step %d: non-finite loss or gradient", step)
            return
        self.last_lr = float(values.pop("learning_rate"))
        values.pop("nonfinite")
        self.window.add(values)
        self.window.rows += rows

    def _log(self, step: int) -> None:
        if not self.window.sums:
            return
        report = self.report
        values = {
            **metrics_lib.summarize_train(
                self.window.sums,
                self.window.elapsed(),
                rows_per_step=self.window.rows / self.window.sums["steps"],
                tokens_per_row=report.tokens_per_row,
                flops_per_row=report.flops_per_row,
                num_devices=jax.device_count(),
                peak_flops_per_device=self.peak,
            ),
            **report.summarize(self.window.sums),
            "input_wait": self.window.input_wait / max(self.window.elapsed(), 1e-9),
            **self.window.host_rates(),
        }
        # The ETA is the rate since the first line: that line's one step includes compiling,
        # so it has none ("?"), unless it is the last.
        now, remaining = time.perf_counter(), self.cadence.num_steps - step
        if self.eta_from is None:
            self.eta_from, eta = (step, now), (0.0 if remaining == 0 else float("nan"))
        else:
            first_step, first_time = self.eta_from
            eta = remaining * (now - first_time) / max(step - first_step, 1)
        line = metrics_lib.format_train_line(
            step, self.cadence.num_steps, values, self.last_lr, eta, report.short_names
        )
        first_line = self.eta_from == (step, now)
        if jax.process_index() == 0:
            print(line, flush=True)
            if not first_line:
                self._warn_if_input_bound(values["input_wait"])
        self.writer.write_scalars(
            step, {f"train/{k}": v for k, v in {**values, "learning_rate": self.last_lr}.items()}
        )
        self.writer.flush()
        self.summary["train"] = values
        self.window.reset()

    def _warn_if_input_bound(self, input_wait: float) -> None:
        if self.input_bound_windows < 0:
            return
        self.input_bound_windows = self.input_bound_windows + 1 if input_wait > INPUT_BOUND else 0
        if self.input_bound_windows == INPUT_BOUND_WINDOWS:
            self.input_bound_windows = -1
            print(
                f"WARNING: input-bound: the loop waited for host batches more than "
                f"{100 * INPUT_BOUND:.0f}% of the time in {INPUT_BOUND_WINDOWS} log intervals in a "
                f"row ({100 * input_wait:.1f}% in the last); the host pipeline is slower than the "
                "step (docs/benchmarks.md, 'Host pipeline')",
                flush=True,
            )

    def _eval(self, step: int, params) -> None:
        values = self.evaluate(params) if self.evaluate else {}
        if not values:
            return
        if jax.process_index() == 0:
            text = " ".join(f"{k} {v:.4f}" for k, v in values.items())
            print(f"eval step {step} {text}", flush=True)
        self.writer.write_scalars(step, {f"eval/{k}": v for k, v in values.items()})
        self.writer.flush()
        self.summary["eval"], self.summary["eval_step"] = values, step

    def _save(self, step: int, state) -> None:
        if step == self.last_saved or step == 0:
            return
        self._check_lease(step)  # LeaseError (one line) when another run took the workdir
        self.checkpoints.save(step, state, self.rng_data, self.meta(step))
        self.last_saved = step

    def close(self) -> None:
        self.stop.restore()
        self.writer.close()
        self.checkpoints.close()
        if self.held is not None:
            self.held.release()


def print_summary(summary: dict) -> None:
    """``final summary: {...}`` (JSON) on process 0: the last train window, eval, step."""
    if jax.process_index() == 0:
        kept = {k: v for k, v in summary.items() if k not in ("state", "stopped")}
        print(f"final summary: {json.dumps(kept, sort_keys=True, default=float)}", flush=True)
