"""A pretraining workdir: the run's record, verified checkpoints, and what a run may change.

The layout and the restore order are ``bertjax.training.checkpoint``'s docstring. A run goes:

1. :func:`check_resumable` (read only): a workdir that holds a run must hold this run's model
   (every architecture field of ``BertConfig`` equal, but a 'modernbert' phase's
   :data:`PHASE_FIELDS`; the error lists the ones that differ) and
   vocab (the fingerprint of ``config.data.vocab_file``; differing size or content is an error
   naming both files, unless ``config.allow_vocab_change``).
2. :meth:`Checkpoints.restore` (read only): the newest step whose manifest verifies
   (``checkpoint_manifest``); steps that fail verification or are incomplete (no manifest yet:
   the run was killed before its save was sealed) are named in one line each and skipped. A step
   that failed verification while none verifies is an error: nothing starts over a damaged run;
   a workdir with only incomplete saves starts afresh.
3. Only then :func:`write_record` and :meth:`Checkpoints.open_for_writing`: steps newer than the
   restored one (they failed verification or are incomplete) are removed so that the run can
   save those step numbers again: on a local disk they move to ``checkpoints_rejected/`` (a
   rename: atomic, and they stay for inspection); on ``gs://``, where a directory is a prefix and
   a rename a copy and a delete of every object, they are deleted, manifest first (a run killed
   half way through leaves an incomplete step, skipped and deleted by the next run). The record
   (format 3) keeps what a resume needs of the run's init checkpoint, so that a resume never
   reads it (``bertjax.training.init_record``; format 2, without it, still resumes). Saves
   start; each step's manifest is written by a background sealer once orbax has finalized it,
   and only then may older steps go (``bertjax.training.retention``: orbax deletes nothing).

A rejected run therefore leaves the workdir as it found it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import time
from collections.abc import Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from bertjax import atomic
from bertjax.model.config import BertConfig
from bertjax.model.encoder import unstack_layers
from bertjax.training import checkpoint_manifest as manifest
from bertjax.training import retention
from bertjax.training.checkpoint import (
    CONFIG_FILE,
    TOKENIZER_FILES,
    CheckpointError,
    compare_vocab,
    read_bert_config,
    read_meta,
    tokenizer_kind,
    vocab_fingerprint,
    vocab_in,
)
from bertjax.training.init_record import INIT_KEY, InitRecord

META_FILE = "bertjax_workdir.json"
CHECKPOINTS_DIR = "checkpoints"
REJECTED_DIR = "checkpoints_rejected"
FORMAT_VERSION = 3  # 2: the steps carry manifests; 3: the record's "init" (init_record)
READS = (2, 3)  # format 2 resumes as before, reading its init checkpoint
RUNTIME_FIELDS = ("dtype", "param_dtype", "scan_layers", "remat_policy", "attention_impl",
                  "cpu_forms", "gather_last_layer", "attention_check")  # fmt: skip
# What a 'modernbert' phase may change on resume (no weight depends on them): its context
# extension raises the length and the RoPE bases (configs/modernbert_base.py, phase 2).
PHASE_FIELDS = ("max_position_embeddings", "global_rope_theta", "local_rope_theta")


def read_record(workdir) -> dict | None:
    """``bertjax_workdir.json`` + the recorded BertConfig, or None for a workdir with no run.
    ``"init"``: the :class:`~bertjax.training.init_record.InitRecord` or None (always None in
    format 2, which has no such entry)."""
    root = epath.Path(workdir)
    if not (root / META_FILE).exists():
        return None
    if not (root / CONFIG_FILE).exists():
        raise CheckpointError(f"{root}: a run record without {CONFIG_FILE}")
    meta = read_meta(root / META_FILE, versions=READS)  # CheckpointError naming the file
    if meta["format_version"] >= 3 and INIT_KEY not in meta:
        raise CheckpointError(f"{root / META_FILE}: no {INIT_KEY!r} entry")
    init = InitRecord.from_json(meta.get(INIT_KEY), root / META_FILE)
    return {**meta, "init": init, "bert_config": read_bert_config(root / CONFIG_FILE)}


def check_resumable(workdir, bert_config: BertConfig, vocab_file: str, allow_vocab_change: bool):
    """Raises CheckpointError when ``workdir`` holds another model or vocab (module doc, 1)."""
    record = read_record(workdir)
    if record is None:
        return None
    recorded = record["bert_config"]
    free = RUNTIME_FIELDS + (PHASE_FIELDS if recorded.is_modern and bert_config.is_modern else ())
    differ = [
        f"config.model.{name} {getattr(recorded, name)!r} -> {getattr(bert_config, name)!r}"
        for name in sorted(vars(recorded))
        if name not in free and getattr(recorded, name) != getattr(bert_config, name)
    ]
    if differ:
        raise CheckpointError(
            f"{workdir} holds a run of another model ({', '.join(differ)}); resume with the "
            "recorded model or use a new workdir (nothing was changed)"
        )
    if vocab_file and not allow_vocab_change:
        recorded_vocab = str(vocab_in(workdir, record))
        compare_vocab(record.get("vocab") or vocab_fingerprint(recorded_vocab), recorded_vocab,
                      vocab_file, "config.data.vocab_file")  # fmt: skip
    return record


def write_record(workdir, bert_config, vocab_file: str, do_lower_case: bool, config_json: str,
                 attention_check: dict | None = None,
                 init: InitRecord | None = None):  # fmt: skip
    """Writes the run's record (each file atomically, ``bertjax_workdir.json`` last), once the
    run is accepted; ``attention_check``: what the attention kernel's self-check decided
    (``kernel_check.record_for``), or None when none ran; ``init``: the run's init checkpoint,
    None for a fresh init."""
    root = epath.Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    meta = {
        "format_version": FORMAT_VERSION,
        "do_lower_case": bool(do_lower_case),
        "vocab": vocab_fingerprint(vocab_file),
        "tokenizer": tokenizer_kind(vocab_file),
        INIT_KEY: None if init is None else init.to_json(),
    }
    if attention_check is not None:
        meta["attention_check"] = attention_check
    atomic.write_bytes(
        root / TOKENIZER_FILES[meta["tokenizer"]], epath.Path(vocab_file).read_bytes()
    )
    atomic.write_text(root / CONFIG_FILE, bert_config.portable().to_json())
    atomic.write_text(root / "config.json", config_json)
    atomic.write_text(root / META_FILE, json.dumps(meta, indent=2))


def _composite(state=None, rng=None, meta=None, restore: bool = False):
    if restore:
        return ocp.args.Composite(
            state=ocp.args.StandardRestore(state),
            rng=ocp.args.StandardRestore(rng),
            meta=ocp.args.JsonRestore(),
        )
    return ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        rng=ocp.args.StandardSave(rng),
        meta=ocp.args.JsonSave(meta),
    )


class _FailedSaveLines(logging.Filter):
    """Drops the lines orbax logs, each with a traceback, while a background save fails: the run
    reports that failure itself in one line (:meth:`Checkpoints.check_for_errors`). Only ERROR
    records of orbax's modules on the ``absl`` logger whose message is one of these; any other
    error orbax logs still shows."""

    FAILED_SAVE = re.compile(
        r"_SignalingThread\.run\(\) raised an exception"
        r"|Failed to run \d+ Handler Commit operations"
        r"|Save Finalize thread \(\w+\) failed"
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.levelno >= logging.ERROR
            and "/orbax/" in record.pathname
            and self.FAILED_SAVE.search(record.getMessage())
        )


@contextlib.contextmanager
def _failed_save_lines_dropped():
    noise, logger = _FailedSaveLines(), logging.getLogger("absl")
    logger.addFilter(noise)
    try:
        yield
    finally:
        logger.removeFilter(noise)


def _path(path: epath.Path) -> epath.Path:
    return path if str(path).startswith("gs://") else path.resolve()


class Checkpoints:
    """The workdir's ``checkpoints/``: verified restore, saves sealed with manifests."""

    def __init__(self, workdir, *, keep: int, async_save: bool, keep_every: int = 0,
                 log: Callable[[str], None] = print):  # fmt: skip
        self.root = epath.Path(workdir)
        self.directory = _path(self.root / CHECKPOINTS_DIR)
        self.keep, self.async_save = retention.check_keep(keep), bool(async_save)
        self.keep_every = retention.check_keep_every(keep_every)
        self.log = log
        self.rejected: list[int] = []  # steps newer than the restored one: moved aside
        self.manager = self.sealer = None
        self._quiet = contextlib.ExitStack()

    def _step_to_restore(self) -> int | None:
        """The step to restore (process 0 decides; every process gets the same)."""
        step = -1
        if jax.process_index() == 0:
            found = manifest.step_dirs(self.directory)
            chosen, damaged = self._newest_verified(found)
            if damaged and chosen is None:
                step = -2
            else:
                step = -1 if chosen is None else chosen
                self.rejected = [s for s, _ in found if chosen is None or s > chosen]
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils  # noqa: PLC0415

            step = int(multihost_utils.broadcast_one_to_all(np.int32(step)))
        if step == -2:
            raise CheckpointError(
                f"{self.directory}: no checkpoint verifies (see the lines above); nothing was "
                "started: move the directory aside to start the run afresh"
            )
        return None if step < 0 else step

    def _newest_verified(self, found) -> tuple[int | None, bool]:
        """(newest step that verifies or None, whether a step failed verification); one log line
        per step passed over. Incomplete saves (no manifest, empty) are skipped like orbax's
        temporary directories; a run with nothing but incomplete saves starts afresh."""
        damaged = False
        for i, (step, path) in enumerate(found):
            try:
                manifest.verify(path)
                return step, damaged
            except manifest.CheckpointCorrupt as e:
                then = f"trying step {found[i + 1][0]}" if i + 1 < len(found) else "none left"
                if e.incomplete:
                    self.log(f"checkpoint step {step}: {e.reason}; {then}")
                else:
                    damaged = True
                    self.log(f"checkpoint step {step} failed verification: {e.reason}; {then}")
        return None, damaged

    def restore(self, abstract_state, shardings, abstract_rng):
        """(state, rng_data, meta) of the newest usable step in ``shardings``, or None."""
        step = self._step_to_restore()
        if step is None:
            return None
        target = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            abstract_state,
            shardings,
        )
        # A checkpointer on the one step directory: a manager would scan (and warn about) the
        # unverified steps around it.
        reader = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
        try:
            restored = reader.restore(
                self.directory / str(step), args=_composite(target, abstract_rng, restore=True)
            )
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(
                f"{self.directory}/{step}: cannot restore into the current train state (was "
                f"the optimizer config changed?): {str(e).splitlines()[0]}"
            ) from None
        finally:
            reader.close()
        return restored.state, restored.rng, restored.meta

    def open_for_writing(self) -> None:
        """After the run is accepted: removes the rejected steps (module doc, 3), then starts the
        manager and the sealer."""
        if jax.process_index() == 0 and self.rejected:
            if str(self.directory).startswith("gs://"):
                for step in self.rejected:
                    self._delete(step)
            else:
                self._move_aside(self.rejected)
        if jax.process_count() > 1:  # no process opens the directory before the steps are gone
            from jax.experimental import multihost_utils  # noqa: PLC0415

            multihost_utils.sync_global_devices("bertjax: rejected checkpoint steps removed")
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None,  # bertjax.training.retention deletes, once a newer step is sealed
            save_interval_steps=1,
            create=True,
            # Removes temporary directories a killed run left behind (never taken as valid).
            cleanup_tmp_directories=True,
            enable_async_checkpointing=self.async_save,
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options)
        self._quiet.enter_context(_failed_save_lines_dropped())
        if jax.process_index() == 0:
            present = [step for step, _ in manifest.step_dirs(self.directory)]
            retained = retention.Retention(
                self.directory, self.keep, present, keep_every=self.keep_every, log=self.log
            )
            self.sealer = manifest.ManifestSealer(
                self.directory, log=self.log, on_sealed=retained.sealed
            )

    def _move_aside(self, steps: list[int]) -> None:
        """Local disks: one rename per step, atomic and free; the step stays for inspection."""
        aside = self.root / REJECTED_DIR
        aside.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        for step in steps:
            (self.directory / str(step)).rename(aside / f"{step}-{stamp}")
            self.log(f"checkpoint step {step}: moved to {aside / f'{step}-{stamp}'}")

    def _delete(self, step: int) -> None:
        """``gs://``: a rename would copy every object, so the step is deleted, manifest first
        (``retention.delete_step``): a run killed half way leaves an incomplete step, which the
        next run skips and deletes again."""
        step_dir = self.directory / str(step)
        self.log(f"checkpoint step {step}: deleting {step_dir} (it did not verify)")
        retention.delete_step(step_dir)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, rng_data, meta: dict) -> None:
        """Starts an (async) save of the full state; its manifest follows when it is final."""
        with self._failures():
            self.manager.wait_until_finished()  # the previous save: its bytes are on disk
            self.manager.check_for_errors()
            if self.sealer:  # and sealed (at most one step saved but unsealed)
                self.sealer.wait_sealed()
        self._check_space(step, state)
        with self._failures():
            saved = self.manager.save(int(step), args=_composite(state, rng_data, meta))
        if saved and self.sealer:
            self.sealer.submit(int(step))

    def check_for_errors(self) -> None:
        """Raises CheckpointError (one line) when a background save failed."""
        with self._failures():
            self.manager.check_for_errors()

    def _check_space(self, step: int, state) -> None:
        """On a local disk: stops the run before a save that cannot fit (orbax would fail half
        way, in background threads), keeping the last complete checkpoint."""
        if str(self.directory).startswith("gs://") or jax.process_index() != 0:
            return
        needed = 1.05 * sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
        free = shutil.disk_usage(self.directory).free
        if free < needed:
            kept = self.manager.latest_step()
            kept = "there is none yet" if kept is None else f"step {kept}, is kept"
            raise CheckpointError(
                f"checkpoint step {step} needs about {needed / 2**20:.1f} MiB in "
                f"{self.directory}, {free / 2**20:.1f} MiB are free: the run stopped before "
                f"saving; the last complete checkpoint, {kept}"
            )

    @contextlib.contextmanager
    def _failures(self):
        try:
            yield
        except Exception as e:  # noqa: BLE001 - orbax re-raises whatever the save raised
            reason = (str(e).splitlines() or [""])[0]
            raise CheckpointError(
                f"saving a checkpoint in {self.directory} failed ({type(e).__name__}: "
                f"{reason[:300]}); the run stopped; the last complete checkpoint is kept"
            ) from None

    def finish(self) -> None:
        """Waits for the saves in flight and their manifests."""
        if self.manager is not None:
            with self._failures():
                self.manager.wait_until_finished()
                self.manager.check_for_errors()
        if self.sealer is not None:
            self.sealer.close()
            self.sealer = None

    def close(self) -> None:
        """Also on the error path: the saves orbax finalized get their manifests, so that the
        checkpoint an error message calls kept is the one the next run restores."""
        if self.manager is not None:
            with contextlib.suppress(Exception):  # a failed save was reported already
                self.manager.close()  # waits for the saves in flight
        if self.sealer is not None:
            sealer, self.sealer = self.sealer, None
            try:
                sealer.close()
            except Exception as e:  # noqa: BLE001 - the run is stopping on an earlier error
                self.log(f"checkpoint manifests: {type(e).__name__}: {e}")
        self._quiet.close()


def latest_params(workdir, *, log: Callable[[str], None] = print):
    """The newest verified step's params -> (params, BertConfig, vocab_file, do_lower_case).

    ``params`` is an unscanned dict of numpy arrays with top-level ``encoder, pooler, mlm, nsp``.
    Steps that fail verification are named on ``log`` and skipped, as at restore. A recorded
    ``num_layers`` other than the step's layer count is an error naming ``bert_config.json``.
    """
    root = epath.Path(workdir)
    record = read_record(root)
    if record is None or not vocab_in(root, record).exists():
        raise CheckpointError(f"{root}: not a bertjax training workdir, {META_FILE} is missing")
    directory = _path(root / CHECKPOINTS_DIR)
    step = manifest.latest_verified_step(directory, log=log)
    if step is None:
        raise CheckpointError(f"{directory}: no complete checkpoint that verifies, nothing to read")
    checkpointer = ocp.PyTreeCheckpointer()
    state_dir = directory / str(step) / "state"
    metadata = checkpointer.metadata(state_dir).item_metadata
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
    params = jax.tree.map(
        np.asarray, checkpointer.restore(state_dir, restore_args=restore_args)["params"]
    )
    bert_config = record["bert_config"]
    layers = params["encoder"].get("layers", {})
    stacked = "layer" in layers  # scanned: one entry whose leaves have a leading layer axis
    found = len(jax.tree.leaves(layers["layer"])[0]) if stacked else len(layers)
    if found != bert_config.num_layers:
        raise CheckpointError(
            f"{root / CONFIG_FILE}: num_layers={bert_config.num_layers}, but {state_dir} has "
            f"{found} encoder layers"
        )
    if stacked:
        params = {**params, "encoder": unstack_layers(params["encoder"], bert_config.num_layers)}
    return params, bert_config, str(vocab_in(root, record)), bool(record["do_lower_case"])
