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

2. A **training workdir** (``bertjax.train``): see the section added there; it keeps the full
   train state under ``WORKDIR/checkpoints/<step>/`` via an orbax ``CheckpointManager``.
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

from bertjax.model import BertConfig, stack_layers, unstack_layers

FORMAT_VERSION = 1
META_FILE = "bertjax_checkpoint.json"
CONFIG_FILE = "bert_config.json"
VOCAB_FILE = "vocab.txt"
PARAMS_DIR = "params"


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete or does not match what was expected."""


def is_params_checkpoint(path: str | os.PathLike) -> bool:
    return (epath.Path(path) / META_FILE).exists()


def save_params(path: str | os.PathLike, params: dict, bert_config: BertConfig, vocab_file: str,
                do_lower_case: bool, *, overwrite: bool = False) -> epath.Path:
    """Writes a params-only checkpoint atomically. ``params`` may be scanned or unscanned."""
    dst = epath.Path(path)
    if dst.exists() and not overwrite:
        raise CheckpointError(f"{dst}: already exists (pass overwrite=True / --overwrite to replace it)")
    params = jax.device_get(params)
    if bert_config.scan_layers and "layers" in params.get("encoder", {}) \
            and "layer" in params["encoder"]["layers"]:
        params = {**params, "encoder": unstack_layers(params["encoder"], bert_config.num_layers)}
    tmp = dst.parent / f".{dst.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir(parents=True)
        (tmp / META_FILE).write_text(json.dumps({
            "format_version": FORMAT_VERSION,
            "do_lower_case": bool(do_lower_case),
            "heads": sorted(k for k in params if k != "encoder"),
        }, indent=2))
        (tmp / CONFIG_FILE).write_text(bert_config.replace(scan_layers=False).to_json())
        epath.Path(vocab_file).copy(tmp / VOCAB_FILE)
        checkpointer = ocp.PyTreeCheckpointer()
        checkpointer.save((tmp / PARAMS_DIR).resolve() if not str(tmp).startswith("gs://")
                          else tmp / PARAMS_DIR, jax.tree.map(np.asarray, params))
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
    meta = json.loads((src / META_FILE).read_text())
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{src / META_FILE}: format_version {meta.get('format_version')!r}, "
                              f"this bertjax reads {FORMAT_VERSION}")
    try:
        bert_config = BertConfig.from_dict(json.loads((src / CONFIG_FILE).read_text()),
                                           source=str(src / CONFIG_FILE))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{src / CONFIG_FILE}: {e}") from None
    params = ocp.PyTreeCheckpointer().restore((src / PARAMS_DIR).resolve()
                                              if not str(src).startswith("gs://") else src / PARAMS_DIR)
    params = jax.tree.map(np.asarray, params)
    if scan_layers:
        params = {**params, "encoder": stack_layers(params["encoder"], bert_config.num_layers)}
    return params, bert_config.replace(scan_layers=scan_layers), meta


def _rmtree(path: epath.Path) -> None:
    if str(path).startswith("gs://"):
        path.rmtree()
    else:
        shutil.rmtree(path, ignore_errors=True)
