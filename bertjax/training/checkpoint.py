"""Checkpoint layout and restore order (the contract), and params-only checkpoints.

Two kinds of checkpoint exist, both plain directories (local or ``gs://``), and every directory
of weights carries a manifest (``checkpoint_manifest``: each file's size and crc32c, written last)
that is verified before it is trusted:

1. A **params-only bertjax checkpoint** (what ``python -m bertjax.convert --to=bertjax`` and
   fine-tuning write; what ``config.init_checkpoint``, fine-tuning, feature extraction and
   ``convert`` read, through :func:`load_params` and ``bertjax.interop``)::

       DIR/bertjax_checkpoint.json   {"format_version": 2, "do_lower_case": bool, "heads": [...],
                                      "vocab": {"entries": N, "sha256": "..."},
                                      "tokenizer": "wordpiece" | "sentencepiece" | "bpe",
                                      "task": {"name", "head", "labels"}  (fine-tuned only)}
       DIR/bert_config.json          BertConfig.to_json()  (the architecture, activation included)
       DIR/vocab.txt                 the vocab the embedding rows refer to, named for its
                                     tokenizer (TOKENIZER_FILES: vocab.txt, spiece.model or a
                                     BPE's tokenizer.json; no "tokenizer" in the record:
                                     WordPiece's vocab.txt, as written before the key)
       DIR/params/                   orbax PyTree checkpoint of the params dict, numpy leaves,
                                     always in the *unscanned* layout (``encoder/layers/layer_{i}``)
       DIR/bertjax_manifest.json     every file above, verified by load_params

   ``heads`` lists the top-level subtrees besides ``encoder`` (e.g. ``["pooler", "mlm", "nsp"]``).
   ``task`` (written by fine-tuning) says what a task head means: the task's ``name`` (e.g.
   ``"mrpc"``; null when unknown), its ``head`` (``bertjax.finetune.tasks.HEADS``) and its
   ``labels`` (class names by id for classification and tagging, else null); HF export
   (``bertjax.interop.hf``) needs it to pick the model class and write ``id2label``.
   On a local disk the directory is written under a temporary name, sealed and renamed into
   place, so a crash never leaves a half-written checkpoint at the destination (on ``gs://``
   see below).

2. A **training workdir** (``bertjax.main`` and ``bertjax.finetune``'s train runs, through the
   trainer core; ``bertjax.training.workdir``)::

       WORKDIR/bertjax_lease.json     the live run's lease (``bertjax.training.lease``)
       WORKDIR/bertjax_workdir.json   {"format_version": 3, "do_lower_case": bool,
                                       "vocab": {"entries": N, "sha256": "..."},
                                       "tokenizer": as a params-only checkpoint's,
                                       "init": {"source", "format", "params_sha256",
                                                "subtrees", "fresh"} or null}
                                      "init": where the initial params came from, so that a
                                      resume never reads the init checkpoint
                                      (``bertjax.training.init_record``); format 2 (no "init")
                                      still resumes, reading it, and is rewritten as 3
       WORKDIR/bert_config.json       the architecture being trained
       WORKDIR/vocab.txt              copy of config.data.vocab_file (TOKENIZER_FILES' name)
       WORKDIR/config.json            the full run config, for the record
       WORKDIR/checkpoints/<step>/    orbax CheckpointManager step directories:
           state/   the full TrainState (params in the layout being trained, optimizer state,
                    step, non-finite skip count), sharded arrays
           rng/     the base training PRNG key data <uint32>[2]
           meta/    JSON: pretraining {"step", "data_signature", "data_position"}:
                    data_position = batches each host has consumed from the stream named by
                    data_signature; fine-tuning {"step", "run", "train_loss"}: the run's task,
                    data, checkpoint and hyper-parameters, which a resume must share
           bertjax_manifest.json      written once orbax has finalized the step
       WORKDIR/checkpoints_rejected/  local disks: steps that failed verification, moved aside
                                      (on gs:// they are deleted: bertjax.training.workdir)
       WORKDIR/tensorboard/           event files

   The record files are written only once a run is accepted (after every check of the config
   against the workdir and the restore). Saves are asynchronous (``config.checkpoint.async_save``)
   every ``config.checkpoint.every_steps`` steps and keep the last ``config.checkpoint.keep``
   sealed steps, and the multiples of ``config.checkpoint.keep_every`` (> 0) for good: an older
   step is deleted only once a newer one is sealed, so after the first seal some step always
   verifies (``bertjax.training.retention``, which alone deletes steps).

   **Restore order** (``bertjax.training.start``): this workdir's newest step
   that verifies (full state, restored straight into the current shardings, any mesh) ->
   the run's initial params (``config.init_checkpoint``, any format ``bertjax.interop`` reads;
   pretraining: its subtrees plus fresh heads where it has none, ``bertjax.pretrain.continued``;
   fine-tuning: the pretrained checkpoint plus fresh heads; a fresh optimizer state; on a
   resume read only here, checked against the record's fingerprint) -> fresh
   initialisation. Vocab fingerprints are compared at every one of these (a differing
   size or content is an error unless ``config.allow_vocab_change``).

**On ``gs://``** a directory is a prefix and a rename is a copy and a delete of every object:
neither atomic nor cheap for gigabytes of train state, so nothing here is ever renamed there.

- A step that is rejected at restore (it failed verification, or its save never finished) is
  **deleted** once the run is accepted, its manifest first (``workdir.Checkpoints``). Deleting
  is safe to repeat: a step whose deletion has begun can never verify again, so a run killed half
  way leaves an incomplete step, which the next run skips and deletes in turn. (Skipping alone
  would leave the step number taken, and orbax refuses to save an existing step; recording it
  aside would still need its objects out of the way.) The step is named in one line; with the
  bucket's soft delete (GCS's default: 7 days) or object versioning its objects can be restored.
- Steps are sealed and verified from the object listing's sizes and crc32c, which GCS computed
  when each object was written, not by reading them back (``checkpoint_manifest``).
- A params-only checkpoint is written in place, an existing one deleted first (manifest first),
  and sealed last: a crash leaves one without a manifest, which :func:`load_params` refuses.

Tested for real against a local GCS emulator through TensorFlow's gs:// filesystem, tensorstore
(orbax) and google-cloud-storage: ``tests/gcs/`` (kill -9 at each stage of a save, damaged
steps, faults on the wire).
"""

from __future__ import annotations

import hashlib
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
from bertjax.training import checkpoint_manifest

FORMAT_VERSION = 2  # a manifest and a vocab fingerprint
META_FILE = "bertjax_checkpoint.json"
CONFIG_FILE = "bert_config.json"
VOCAB_FILE = "vocab.txt"
# The name a checkpoint or workdir gives its copy of the vocab, by tokenizer kind
# (bertjax.data.tokenization.TOKENIZER_KINDS), which the file's own name tells.
TOKENIZER_FILES = {
    "wordpiece": VOCAB_FILE,
    "sentencepiece": "spiece.model",
    "bpe": "tokenizer.json",
}


def tokenizer_kind(vocab_file) -> str:
    """The tokenizer a vocab file is for: a SentencePiece ``.model``, a HF ``tokenizer.json``
    (``.json``: byte-level BPE) or a WordPiece vocab.txt (anything else)."""
    name = str(vocab_file)
    if name.endswith(".model"):
        return "sentencepiece"
    return "bpe" if name.endswith(".json") else "wordpiece"


def vocab_in(directory, record: dict) -> epath.Path:
    """The vocab file a checkpoint or workdir holds, by its record's ``tokenizer``."""
    kind = record.get("tokenizer", "wordpiece")
    if kind not in TOKENIZER_FILES:
        raise CheckpointError(
            f"{directory}: tokenizer={kind!r:.40} in its record; expected one of "
            f"{sorted(TOKENIZER_FILES)}"
        )
    return epath.Path(directory) / TOKENIZER_FILES[kind]


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
    task: dict | None = None,
    overwrite: bool = False,
) -> epath.Path:
    """Writes a params-only checkpoint atomically. ``params`` may be scanned or unscanned;
    ``task`` is the fine-tuned model's task record (module docstring), None for pretrained."""
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
    on_gcs = str(dst).startswith("gs://")
    tmp = dst if on_gcs else dst.parent / f".{dst.name}.tmp-{uuid.uuid4().hex[:8]}"
    _check_space(dst, params, vocab_file)
    try:
        if on_gcs and dst.exists():  # the manifest first: a half-deleted one never verifies
            (dst / checkpoint_manifest.MANIFEST_FILE).unlink(missing_ok=True)
            dst.rmtree()
        tmp.mkdir(parents=True, exist_ok=on_gcs)
        (tmp / META_FILE).write_text(
            json.dumps(
                {
                    "format_version": FORMAT_VERSION,
                    "do_lower_case": bool(do_lower_case),
                    "heads": sorted(k for k in params if k != "encoder"),
                    "vocab": vocab_fingerprint(vocab_file),
                    "tokenizer": tokenizer_kind(vocab_file),
                    **({"task": task} if task is not None else {}),
                },
                indent=2,
            )
        )
        (tmp / CONFIG_FILE).write_text(bert_config.portable().to_json())
        epath.Path(vocab_file).copy(tmp / TOKENIZER_FILES[tokenizer_kind(vocab_file)])
        checkpointer = ocp.PyTreeCheckpointer()
        checkpointer.save(
            tmp / PARAMS_DIR if on_gcs else (tmp / PARAMS_DIR).resolve(),
            jax.tree.map(np.asarray, params),
        )
        checkpoint_manifest.write_manifest(tmp)
        if not on_gcs:
            if dst.exists():
                _rmtree(dst)
            tmp.rename(dst)
    except (OSError, ValueError) as e:  # a full disk, a lost connection (tensorstore raises
        # ValueError): one line, nothing left at dst (on gs://: nothing sealed)
        reason = (str(e).splitlines() or [""])[0][:300]
        raise CheckpointError(f"writing {dst} failed ({type(e).__name__}: {reason})") from None
    finally:
        if not on_gcs and tmp.exists():
            _rmtree(tmp)
    return dst


def _check_space(dst: epath.Path, params, vocab_file) -> None:
    """A local destination must have room for the checkpoint before anything is written: orbax
    would otherwise fail half way, with pages of tracebacks from its background threads."""
    if str(dst).startswith("gs://"):
        return
    needed = 1.05 * sum(np.asarray(x).nbytes for x in jax.tree.leaves(params))
    needed += os.path.getsize(vocab_file) if os.path.exists(vocab_file) else 0
    existing = next(p for p in (dst, *dst.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if free < needed:
        raise CheckpointError(
            f"writing {dst} needs about {needed / 2**20:.1f} MiB, {free / 2**20:.1f} MiB are free "
            f"in {existing}; nothing was written"
        )


def load_params(path: str | os.PathLike, *, scan_layers: bool = False):
    """Reads a verified params-only checkpoint -> (params of numpy arrays, BertConfig, meta).

    The returned config has ``scan_layers`` set as asked and the params are in that layout.
    ``meta["vocab"]`` is the fingerprint of the checkpoint's vocab (``vocab_in(path, meta)``).
    """
    src = epath.Path(path)
    for name in (META_FILE, CONFIG_FILE, PARAMS_DIR):
        if not (src / name).exists():
            raise CheckpointError(f"{src}: not a bertjax checkpoint, {name} is missing")
    meta = read_meta(src / META_FILE)
    if not vocab_in(src, meta).exists():
        raise CheckpointError(
            f"{src}: not a bertjax checkpoint, {vocab_in(src, meta).name} is missing"
        )
    checkpoint_manifest.verify(src)  # CheckpointCorrupt: one line naming the file
    heads = meta.get("heads", [])
    if not isinstance(heads, list) or not all(isinstance(h, str) for h in heads):
        raise CheckpointError(f"{src / META_FILE}: heads={heads!r:.60}, expected a list of names")
    bert_config = read_bert_config(src / CONFIG_FILE)
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


def read_meta(path: epath.Path, versions: tuple[int, ...] = (FORMAT_VERSION,)) -> dict:
    """``bertjax_checkpoint.json`` / ``bertjax_workdir.json`` (``versions``: the format versions
    its reader knows): the format version is checked, and ``do_lower_case`` must be a bool
    (``bool("false")`` would silently be True)."""
    meta = _read_json(path)
    version = meta.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or version not in versions:
        raise CheckpointError(
            f"{path}: format_version {version!r:.40}, this bertjax reads "
            f"{' or '.join(map(str, versions))}"
        )
    if not isinstance(meta.get("do_lower_case"), bool):
        raise CheckpointError(
            f"{path}: do_lower_case={meta.get('do_lower_case')!r:.40}, expected true or false"
        )
    vocab = meta.get("vocab")
    if not (
        isinstance(vocab, dict)
        and isinstance(vocab.get("entries"), int)
        and isinstance(vocab.get("sha256"), str)
    ):
        raise CheckpointError(f"{path}: vocab={vocab!r:.60}, expected its entries and sha256")
    if "task" in meta and not _is_task_record(meta["task"]):
        raise CheckpointError(
            f'{path}: task={meta["task"]!r:.80}, expected {{"name": string or null, '
            '"head": string, "labels": list of strings or null}'
        )
    return meta


def _is_task_record(task) -> bool:
    labels = task.get("labels") if isinstance(task, dict) else None
    return (
        isinstance(task, dict)
        and set(task) == {"name", "head", "labels"}
        and isinstance(task["name"], str | None)
        and isinstance(task["head"], str)
        and (labels is None or isinstance(labels, list) and all(isinstance(x, str) for x in labels))
    )


def read_bert_config(path: epath.Path) -> BertConfig:
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


# ---------------------------------------------------------------- vocab identity


def vocab_fingerprint(vocab_file) -> dict:
    """{"entries": N, "sha256": hex} of a vocab.txt (non-empty lines), a SentencePiece model or a
    HF tokenizer.json (its model's vocab and added tokens: distinct ids)."""
    data = epath.Path(vocab_file).read_bytes()
    if str(vocab_file).endswith(".model"):
        import sentencepiece  # noqa: PLC0415

        entries = sentencepiece.SentencePieceProcessor(model_proto=data).get_piece_size()
    elif str(vocab_file).endswith(".json"):
        entries = len(set(tokenizer_json_ids(data, str(vocab_file)).values()))
    else:
        entries = sum(1 for line in data.decode("utf-8", errors="replace").splitlines() if line)
    return {"entries": int(entries), "sha256": hashlib.sha256(data).hexdigest()}


def tokenizer_json_ids(data: bytes, path: str) -> dict[str, int]:
    """token -> id of a HF tokenizer.json's bytes: its model's vocab and its added tokens
    (CheckpointError naming ``path`` when it has no model vocab)."""
    try:
        values = json.loads(data)
        ids = dict(values["model"]["vocab"])
        ids.update({t["content"]: t["id"] for t in values.get("added_tokens") or ()})
    except (ValueError, KeyError, TypeError, AttributeError):
        raise CheckpointError(f"{path}: not a HF tokenizer.json with a model vocab") from None
    return ids


def compare_vocab(recorded: dict, recorded_path: str, vocab_file: str, field: str) -> None:
    """Raises CheckpointError when ``vocab_file`` is not the vocab ``recorded`` fingerprints."""
    current = vocab_fingerprint(vocab_file)
    if current["entries"] != recorded["entries"]:
        raise CheckpointError(
            f"{field}={vocab_file} has {current['entries']} entries but {recorded_path}, the "
            f"vocab the checkpoint was trained with, has {recorded['entries']}: sizes differ"
        )
    if current["sha256"] != recorded["sha256"]:
        raise CheckpointError(
            f"{field}={vocab_file} is not {recorded_path}, the vocab the checkpoint was trained "
            f"with: same size ({current['entries']} entries), different content, so every "
            "embedding row would belong to another token (set config.allow_vocab_change=True "
            "if the change is deliberate)"
        )
