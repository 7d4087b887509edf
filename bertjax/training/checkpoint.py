"""Checkpoint layout, saving and restoring.

Two kinds of checkpoint exist, both plain directories (local or ``gs://``):

1. A **params-only bertjax checkpoint** (what ``python -m bertjax.convert --to=bertjax`` writes and
   what ``config.init_checkpoint`` / fine-tuning / feature extraction read)::

       DIR/bertjax_checkpoint.json   {"format_version": 1, "do_lower_case": bool, "heads": [...]}
       DIR/bert_config.json          BertConfig.to_json()  (the architecture, activation included)
       DIR/vocab.txt                 the WordPiece vocab the embedding rows refer to
       DIR/params/                   orbax PyTree checkpoint of the params dict, numpy leaves,
                                     always in the *unscanned* layout (``encoder/layers/layer_{i}``)

   ``heads`` lists the top-level subtrees besides ``encoder`` (e.g. ``["pooler", "mlm", "nsp"]``).
   The directory is written under a temporary name and renamed into place, so a crash never
   leaves a half-written checkpoint at the destination.

2. A **training workdir** (``bertjax.main``), written by the functions below this module's
   params-only part::

       WORKDIR/bertjax_workdir.json   {"format_version": 1, "do_lower_case": bool}  (at start)
       WORKDIR/bert_config.json       the architecture being trained (at start)
       WORKDIR/vocab.txt              copy of config.data.vocab_file (at start)
       WORKDIR/config.json            the full run config (at start, for the record)
       WORKDIR/checkpoints/<step>/    orbax CheckpointManager step directories:
           state/   the full TrainState (params in the layout being trained, optimizer state,
                    step, non-finite skip count), sharded arrays
           rng/     the base training PRNG key data <uint32>[2]
           meta/    JSON {"step", "data_signature", "data_position"}: data_position = batches
                    each host has consumed from the stream named by data_signature
       WORKDIR/tensorboard/           event files

   Saves are asynchronous (``config.checkpoint.async_save``) every
   ``config.checkpoint.every_steps`` steps and keep the last ``config.checkpoint.keep``. Orbax
   writes a step into a temporary directory and renames it when complete, so a run killed during
   a save leaves no directory that ``latest_step`` would take as valid.

   **Restore order** (``bertjax.pretrain.loop.train_and_evaluate``): this workdir's latest complete
   step (full state, restored straight into the current shardings, any mesh) ->
   ``config.init_checkpoint`` (params only, via :func:`load_params`; fresh optimizer state) ->
   fresh initialisation.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from bertjax.model.config import BertConfig
from bertjax.model.encoder import stack_layers, unstack_layers

FORMAT_VERSION = 1
META_FILE = "bertjax_checkpoint.json"
CONFIG_FILE = "bert_config.json"
VOCAB_FILE = "vocab.txt"
PARAMS_DIR = "params"


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete or does not match what was expected."""


def is_params_checkpoint(path: str | os.PathLike) -> bool:
    return (epath.Path(path) / META_FILE).exists()


def save_params(
    path: str | os.PathLike,
    params: dict,
    bert_config: BertConfig,
    vocab_file: str,
    do_lower_case: bool,
    *,
    overwrite: bool = False,
) -> epath.Path:
    """Writes a params-only checkpoint atomically. ``params`` may be scanned or unscanned."""
    dst = epath.Path(path)
    if dst.exists() and not overwrite:
        raise CheckpointError(
            f"{dst}: already exists (pass overwrite=True / --overwrite to replace it)"
        )
    params = jax.device_get(params)
    if (
        bert_config.scan_layers
        and "layers" in params.get("encoder", {})
        and "layer" in params["encoder"]["layers"]
    ):
        params = {**params, "encoder": unstack_layers(params["encoder"], bert_config.num_layers)}
    tmp = dst.parent / f".{dst.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir(parents=True)
        (tmp / META_FILE).write_text(
            json.dumps(
                {
                    "format_version": FORMAT_VERSION,
                    "do_lower_case": bool(do_lower_case),
                    "heads": sorted(k for k in params if k != "encoder"),
                },
                indent=2,
            )
        )
        (tmp / CONFIG_FILE).write_text(bert_config.portable().to_json())
        epath.Path(vocab_file).copy(tmp / VOCAB_FILE)
        checkpointer = ocp.PyTreeCheckpointer()
        checkpointer.save(
            (tmp / PARAMS_DIR).resolve() if not str(tmp).startswith("gs://") else tmp / PARAMS_DIR,
            jax.tree.map(np.asarray, params),
        )
        if dst.exists():
            _rmtree(dst)
        tmp.rename(dst)
    except BaseException:
        if tmp.exists():
            _rmtree(tmp)
        raise
    return dst


def load_params(path: str | os.PathLike, *, scan_layers: bool = False):
    """Reads a params-only checkpoint -> (params of numpy arrays, BertConfig, meta dict).

    The returned config has ``scan_layers`` set as asked and the params are in that layout.
    """
    src = epath.Path(path)
    for name in (META_FILE, CONFIG_FILE, VOCAB_FILE, PARAMS_DIR):
        if not (src / name).exists():
            raise CheckpointError(f"{src}: not a bertjax checkpoint, {name} is missing")
    meta = _read_meta(src / META_FILE)
    heads = meta.get("heads", [])
    if not isinstance(heads, list) or not all(isinstance(h, str) for h in heads):
        raise CheckpointError(f"{src / META_FILE}: heads={heads!r:.60}, expected a list of names")
    bert_config = _read_bert_config(src / CONFIG_FILE)
    params = ocp.PyTreeCheckpointer().restore(
        (src / PARAMS_DIR).resolve() if not str(src).startswith("gs://") else src / PARAMS_DIR
    )
    params = jax.tree.map(np.asarray, params)
    layers = sorted(params.get("encoder", {}).get("layers", {}))
    if layers != sorted(f"layer_{i}" for i in range(bert_config.num_layers)):
        raise CheckpointError(
            f"{src / CONFIG_FILE}: num_layers={bert_config.num_layers}, but {src / PARAMS_DIR} "
            f"has {len(layers)} encoder layers"
        )
    if scan_layers:
        params = {**params, "encoder": stack_layers(params["encoder"], bert_config.num_layers)}
    return params, bert_config.replace(scan_layers=scan_layers), meta


def _read_json(path: epath.Path) -> dict:
    """A JSON object; CheckpointError naming ``path`` if it is not UTF-8 JSON or not an object."""
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError, json.JSONDecodeError
        raise CheckpointError(f"{path}: not a JSON file ({e})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _read_meta(path: epath.Path) -> dict:
    """``bertjax_checkpoint.json`` / ``bertjax_workdir.json``: the format version is checked, and
    ``do_lower_case`` must be a bool (``bool("false")`` would silently be True)."""
    meta = _read_json(path)
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: format_version {meta.get('format_version')!r:.40}, "
            f"this bertjax reads {FORMAT_VERSION}"
        )
    if not isinstance(meta.get("do_lower_case"), bool):
        raise CheckpointError(
            f"{path}: do_lower_case={meta.get('do_lower_case')!r:.40}, expected true or false"
        )
    return meta


def _read_bert_config(path: epath.Path) -> BertConfig:
    try:
        return BertConfig.from_dict(_read_json(path), source=str(path))
    except CheckpointError:
        raise
    except ValueError as e:  # from_dict's message names the file
        raise CheckpointError(str(e)) from None


def _rmtree(path: epath.Path) -> None:
    if str(path).startswith("gs://"):
        path.rmtree()
    else:
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------- training workdir

WORKDIR_META_FILE = "bertjax_workdir.json"
CHECKPOINTS_DIR = "checkpoints"


def write_workdir_info(
    workdir, bert_config: BertConfig, vocab_file: str, do_lower_case: bool, config_json: str
) -> None:
    """Writes what an exporter needs next to the checkpoints (each file atomically)."""
    root = epath.Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    files = {
        WORKDIR_META_FILE: json.dumps(
            {"format_version": FORMAT_VERSION, "do_lower_case": bool(do_lower_case)}, indent=2
        ),
        CONFIG_FILE: bert_config.portable().to_json(),
        VOCAB_FILE: epath.Path(vocab_file).read_text(),
        "config.json": config_json,
    }
    for name, text in files.items():
        tmp = root / f".{name}.tmp-{uuid.uuid4().hex[:8]}"
        tmp.write_text(text)
        tmp.replace(root / name)  # rename() refuses to overwrite on restart


def create_manager(workdir, every_steps: int, keep: int, async_save: bool):
    """An orbax CheckpointManager over ``WORKDIR/checkpoints`` (state, rng and meta items)."""
    options = ocp.CheckpointManagerOptions(
        max_to_keep=int(keep),
        save_interval_steps=1,
        create=True,
        # Removes temporary directories a killed run left behind (never taken as valid anyway).
        cleanup_tmp_directories=True,
        enable_async_checkpointing=bool(async_save),
    )
    path = epath.Path(workdir) / CHECKPOINTS_DIR
    if not str(path).startswith("gs://"):
        path = path.resolve()
    return ocp.CheckpointManager(path, options=options)


def save_train_state(manager, step: int, state, rng_data, meta: dict) -> None:
    """Starts an (async) save of the full state at ``step``; returns once it is scheduled."""
    manager.save(
        int(step),
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            rng=ocp.args.StandardSave(rng_data),
            meta=ocp.args.JsonSave(meta),
        ),
    )


def restore_train_state(manager, abstract_state, state_shardings, abstract_rng):
    """Latest complete step -> (state, rng_data, meta), placed in ``state_shardings``; or None.

    ``abstract_state`` / ``abstract_rng`` are ``jax.ShapeDtypeStruct`` trees; the arrays are
    read straight into the given shardings, so the mesh may differ from the one that saved.
    """
    step = manager.latest_step()
    if step is None:
        return None
    target = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        abstract_state,
        state_shardings,
    )
    try:
        restored = manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target),
                rng=ocp.args.StandardRestore(abstract_rng),
                meta=ocp.args.JsonRestore(),
            ),
        )
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(
            f"{manager.directory}/{step}: cannot restore into the current train "
            f"state (was the model/optimizer config changed?): {e}"
        ) from None
    return restored.state, restored.rng, restored.meta


def latest_params_from_workdir(workdir):
    """Latest training checkpoint of ``workdir`` -> (params, BertConfig, vocab_file, do_lower_case).

    ``params`` is an unscanned dict of numpy arrays with top-level ``encoder, pooler, mlm, nsp``.
    """
    root = epath.Path(workdir)
    for name in (WORKDIR_META_FILE, CONFIG_FILE, VOCAB_FILE):
        if not (root / name).exists():
            raise CheckpointError(f"{root}: not a bertjax training workdir, {name} is missing")
    do_lower_case = _read_meta(root / WORKDIR_META_FILE)["do_lower_case"]
    bert_config = _read_bert_config(root / CONFIG_FILE)
    ckpt_root = root / CHECKPOINTS_DIR
    manager = ocp.CheckpointManager(
        ckpt_root.resolve() if not str(root).startswith("gs://") else ckpt_root,
        options=ocp.CheckpointManagerOptions(create=False, read_only=True),
    )
    step = manager.latest_step() if ckpt_root.exists() else None
    if step is None:
        raise CheckpointError(f"{ckpt_root}: no complete checkpoint to export")
    state_dir = epath.Path(manager.directory) / str(step) / "state"
    checkpointer = ocp.PyTreeCheckpointer()
    metadata = checkpointer.metadata(state_dir).item_metadata
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
    tree = checkpointer.restore(state_dir, restore_args=restore_args)
    params = jax.tree.map(np.asarray, tree["params"])
    encoder = params["encoder"]
    if "layer" in encoder.get("layers", {}):
        params = {**params, "encoder": unstack_layers(encoder, bert_config.num_layers)}
    return params, bert_config, str(root / VOCAB_FILE), do_lower_case
