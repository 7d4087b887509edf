"""What a pretraining run does before its first step: take the workdir, check, restore or init.

Order (``bertjax.training.checkpoint`` documents the layout and restore order):

1. **Lease** (process 0): ``WORKDIR/bertjax_lease.json`` (``bertjax.training.lease``). A live
   holder stops this run with one line naming it; a dead or silent one is taken over with a
   notice. Every process learns the outcome.
2. **Checks, read only**: the workdir's recorded model and vocab against the config
   (``workdir.check_resumable``), then the newest verified checkpoint is restored, else
   ``config.init_checkpoint`` (verified; its vocab fingerprint against ``config.data.vocab_file``)
   or a fresh init.
3. **Accepted**: only now the run's record is written and saving opens. A run rejected in 2
   releases its lease and leaves the workdir as it was (a workdir directory it created is
   removed again if still empty).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from etils import epath
from jax.experimental import multihost_utils

from bertjax.pretrain import step as step_lib
from bertjax.training import checkpoint, lease, lease_stores, workdir


@dataclasses.dataclass
class Start:
    state: step_lib.TrainState
    rng_data: np.ndarray  # <uint32>[2] base training key
    meta: dict | None  # the restored step's meta, or None
    checkpoints: workdir.Checkpoints
    held: lease.Lease | None  # process 0's lease


def _acquire(path) -> lease.Lease | None:
    """Process 0 takes the lease; every process raises LeaseError if it could not."""
    held, error = None, ""
    if jax.process_index() == 0:
        try:
            held = lease.acquire(path)
        except lease.LeaseError as e:
            error = str(e)
    if jax.process_count() > 1:
        failed = multihost_utils.broadcast_one_to_all(np.int32(bool(error)))
        if failed and not error:
            error = f"{path}: process 0 could not take the workdir's lease (see its output)"
    if error:
        raise lease.LeaseError(error)
    return held


def _init_params(config, steps):
    """``config.init_checkpoint``'s params (verified, vocab checked), or None."""
    if not config.init_checkpoint:
        return None
    params, _, meta = checkpoint.load_params(
        config.init_checkpoint, scan_layers=config.model.scan_layers
    )
    if set(params) != set(steps.abstract_state.params):
        raise checkpoint.CheckpointError(
            f"config.init_checkpoint={config.init_checkpoint}: has heads {sorted(params)}, "
            f"pretraining needs {sorted(steps.abstract_state.params)}"
        )
    vocab = str(epath.Path(config.init_checkpoint) / checkpoint.VOCAB_FILE)
    recorded = meta.get("vocab") or checkpoint.vocab_fingerprint(vocab)
    if not config.train.synthetic_data and not config.allow_vocab_change:
        checkpoint.compare_vocab(recorded, vocab, config.data.vocab_file, "config.data.vocab_file")
    rows = params["encoder"]["embeddings"]["word_embeddings"]["embedding"].shape[0]
    if rows != steps.bert_config.vocab_size:
        raise checkpoint.CheckpointError(
            f"config.init_checkpoint={config.init_checkpoint} has a {rows}-entry vocab "
            f"({vocab}), config.model.vocab_size={steps.bert_config.vocab_size}: sizes differ"
        )
    print(f"initialised params from {config.init_checkpoint}", flush=True)
    return params


def _restore_or_init(config, path, steps, checkpoints: workdir.Checkpoints):
    """Step 2 of the module doc: (state, rng_data, meta); nothing is written."""
    real_data = not config.train.synthetic_data
    vocab = config.data.vocab_file if real_data else ""
    record = workdir.check_resumable(path, steps.bert_config, vocab, config.allow_vocab_change)
    init_rng, train_rng = jax.random.split(jax.random.key(config.seed))
    rng = jax.random.key_data(train_rng)
    restored = checkpoints.restore(
        steps.abstract_state,
        steps.state_shardings,
        jax.ShapeDtypeStruct(rng.shape, rng.dtype),
        verified=record is None or record["format_version"] >= 2,
    )
    if restored is not None:
        state, rng_data, meta = restored
        print(f"restored step {int(state.step)} from {checkpoints.directory}", flush=True)
        return state, np.asarray(rng_data), meta
    length, predictions = int(config.data.max_seq_length), int(config.data.max_predictions_per_seq)
    state = step_lib.init_train_state(
        steps.model, steps.tx, steps.state_shardings, init_rng, length, predictions,
        _init_params(config, steps),
    )  # fmt: skip
    return state, np.asarray(rng), None


def start(config, path: str, steps: step_lib.Steps) -> Start:
    """Steps 1-3 of the module doc; raises (one line) with the workdir unchanged."""
    root = epath.Path(path)
    created = not root.exists()
    if jax.process_index() == 0:
        root.mkdir(parents=True, exist_ok=True)
    held = _acquire(root)
    checkpoints = workdir.Checkpoints(
        path, keep=config.checkpoint.keep, async_save=config.checkpoint.async_save
    )
    try:
        state, rng_data, meta = _restore_or_init(config, path, steps, checkpoints)
    except BaseException:
        if held is not None:
            held.release()
            if created:  # ours since this start: nothing but the lease's lock file is in it
                (root / lease_stores.LOCK_FILE).unlink(missing_ok=True)
                if not any(root.iterdir()):
                    root.rmdir()
        raise
    if jax.process_index() == 0 and not config.train.synthetic_data:
        workdir.write_record(
            path,
            steps.bert_config,
            config.data.vocab_file,
            config.data.do_lower_case,
            config.to_json_best_effort(),
        )
    checkpoints.open_for_writing()
    return Start(state, rng_data, meta, checkpoints, held)
