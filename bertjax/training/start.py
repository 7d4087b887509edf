"""What a training run does before its first step: take the workdir, check, restore or init.

Pretraining and fine-tuning start the same way (the workdir layout and restore order are
``bertjax.training.checkpoint``'s docstring):

1. **Lease** (process 0): ``WORKDIR/bertjax_lease.json`` (``bertjax.training.lease``). A live
   holder stops this run with one line naming it; a dead or silent one is taken over with a
   notice. Every process learns the outcome.
2. **Checks, read only**: the workdir's recorded model and vocab against the run's
   (``workdir.check_resumable``), then the newest verified checkpoint is restored, else the
   run's initial params (a checkpoint's, through :class:`Plan`'s ``initial_params``) or a fresh
   init. A resume whose model and vocab came from the workdir's record (``Plan.from_record``)
   reads its init checkpoint only there, and says so in one line when a step restored instead
   (``bertjax.training.init_record``).
3. **Accepted**: only now the run's record is written (with what the attention kernel's
   self-check decided, ``bertjax.training.kernel_check``, and the run's init checkpoint,
   ``Plan.init``) and saving opens. A run rejected in 2
   releases its lease and leaves the workdir as it was (a workdir directory it created is
   removed again if still empty).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from etils import epath
from jax.experimental import multihost_utils

from bertjax.model.config import BertConfig
from bertjax.training import init_record, kernel_check, lease, lease_stores, workdir
from bertjax.training.compiled import Trainer
from bertjax.training.step import TrainState


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a run brings to its workdir."""

    bert_config: BertConfig
    vocab_file: str  # '' = no record (synthetic data): nothing to check or write
    do_lower_case: bool
    config_json: str  # the whole run config, for the record
    allow_vocab_change: bool
    keep: int  # checkpoints kept
    async_save: bool
    lease_ttl_seconds: float  # bertjax.training.lease.acquire's ttl_seconds
    lease_renew_seconds: float  # ... and renew_every
    init_rng: Any  # key for a fresh init
    rng_data: np.ndarray  # <uint32>[2] the base training key saved with every step
    initial_params: Callable[[], Any] = lambda: None  # host params to start from, or None
    check_meta: Callable[[dict], None] = lambda meta: None  # raises: a restored step is not ours
    # The run's init checkpoint for the record (bertjax.training.init_record); None: fresh init.
    init: init_record.InitRecord | None = None
    # A resume that took its model, vocab and casing from the workdir's record: initial_params
    # reads the init checkpoint only if no step restores, and a restored step says it was not.
    from_record: bool = False
    keep_every: int = 0  # steps that are multiples of it are kept for good (0: off)


@dataclasses.dataclass
class Started:
    state: TrainState
    rng_data: np.ndarray  # <uint32>[2] base training key
    meta: dict | None  # the restored step's meta, or None
    checkpoints: workdir.Checkpoints
    held: lease.Lease | None  # process 0's lease


def _acquire(path, plan: Plan) -> lease.Lease | None:
    """Process 0 takes the lease; every process raises LeaseError if it could not."""
    held, error = None, ""
    if jax.process_index() == 0:
        try:
            held = lease.acquire(
                path, ttl_seconds=plan.lease_ttl_seconds, renew_every=plan.lease_renew_seconds
            )
        except lease.LeaseError as e:
            error = str(e)
    if jax.process_count() > 1:
        failed = multihost_utils.broadcast_one_to_all(np.int32(bool(error)))
        if failed and not error:
            error = f"{path}: process 0 could not take the workdir's lease (see its output)"
    if error:
        raise lease.LeaseError(error)
    return held


def _restore_or_init(path, plan: Plan, trainer: Trainer, checkpoints: workdir.Checkpoints):
    """Step 2 of the module doc: (state, rng_data, meta); nothing is written."""
    workdir.check_resumable(path, plan.bert_config, plan.vocab_file, plan.allow_vocab_change)
    rng = plan.rng_data
    restored = checkpoints.restore(
        trainer.abstract_state,
        trainer.state_shardings,
        jax.ShapeDtypeStruct(rng.shape, rng.dtype),
    )
    if restored is not None:
        state, rng_data, meta = restored
        plan.check_meta(meta)
        print(f"restored step {int(state.step)} from {checkpoints.directory}", flush=True)
        if plan.from_record:
            print(init_record.not_read_line(plan.init, path, int(state.step)), flush=True)
        return state, np.asarray(rng_data), meta
    return trainer.init_state(plan.init_rng, plan.initial_params()), np.asarray(rng), None


def start(path: str, plan: Plan, trainer: Trainer) -> Started:
    """Steps 1-3 of the module doc; raises (one line) with the workdir unchanged."""
    checkpoints = workdir.Checkpoints(
        path, keep=plan.keep, async_save=plan.async_save, keep_every=plan.keep_every
    )
    root = epath.Path(path)
    created = not root.exists()
    if jax.process_index() == 0:
        root.mkdir(parents=True, exist_ok=True)
    held = _acquire(root, plan)
    try:
        state, rng_data, meta = _restore_or_init(path, plan, trainer, checkpoints)
    except BaseException:
        if held is not None:
            held.release()
            if created:  # ours since this start: nothing but the lease's lock file is in it
                (root / lease_stores.LOCK_FILE).unlink(missing_ok=True)
                if not any(root.iterdir()):
                    root.rmdir()
        raise
    if jax.process_index() == 0 and plan.vocab_file:
        workdir.write_record(
            path, plan.bert_config, plan.vocab_file, plan.do_lower_case, plan.config_json,
            kernel_check.record_for(plan.bert_config), init=plan.init,
        )  # fmt: skip
    checkpoints.open_for_writing()
    return Started(state, rng_data, meta, checkpoints, held)
