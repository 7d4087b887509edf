"""Frozen encoder activations, computed once: what the feature-based heads train on (§5.3).

:func:`stored` runs the encoder over a split's features (``bertjax.finetune.tasks``' layout,
unpacked ``[N, L]``) and keeps each hidden state a run needs in its own file, so that every
head, and every later run on the same encoder and inputs, reads them instead of running the
encoder again ("extract once, train many heads")::

    DIR/<split>/hidden_<j>.npy   <float32>[N, L, H]  hidden state j (0: the embeddings' output,
                                                       j: layer j's; ``EncoderOutput``)
    DIR/<split>/record.json      {"key": sha256, "hidden_states": [j, ...], "shape": [N, L, H]}

``key`` is the sha256 of the encoder's params (:class:`Encoder`'s fingerprint), its
architecture and compute dtype, and the split's ``input_ids``, ``segment_ids`` and
``input_mask``: files of another key are replaced, missing hidden states are added. Each file is
written through a memory map, a batch at a time, under a temporary name renamed into place, so
memory stays at one batch and a stopped run leaves no half file; the record is written last.
DIR is a local directory (memory maps). :class:`Layers` reads them back as <float32>[N, J, L, H]
batches without loading a split.

The encoder's outputs pass through ``jax.lax.stop_gradient`` (:func:`encode`): whatever is built
on them trains only itself (``tests/finetune/feature_based_test.py`` takes the gradient).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import atomic
from bertjax.model.attention import self_check
from bertjax.model.config import BertConfig
from bertjax.model.encoder import BertEncoder
from bertjax.training import init_record, kernel_check
from bertjax.training import sharding as sh

RECORD = "record.json"
INPUTS = ("input_ids", "segment_ids", "input_mask")


@functools.partial(jax.jit, static_argnums=(0, 1))
def encode(config: BertConfig, indices: tuple[int, ...], encoder_params, input_ids, segment_ids,
           input_mask) -> jax.Array:  # fmt: skip
    """<int32>[B, L] x3 -> <float32>[B, J, L, H]: the hidden states ``indices``, frozen."""
    out = BertEncoder(config).apply({"params": encoder_params}, input_ids, segment_ids,
                                    input_mask, output_hidden_states=True)  # fmt: skip
    stacked = jnp.stack([out.hidden_states[j] for j in indices], axis=1).astype(jnp.float32)
    return jax.lax.stop_gradient(stacked)


@dataclasses.dataclass(frozen=True)
class Encoder:
    """The frozen encoder: its params (unscanned ``encoder`` subtree), config and fingerprint."""

    params: dict
    config: BertConfig
    fingerprint: str  # init_record.params_fingerprint(params)

    @classmethod
    def of(cls, params: dict, config: BertConfig) -> Encoder:
        return cls(params, config, init_record.params_fingerprint(params))


def key_of(encoder: Encoder, arrays: dict) -> str:
    """What the stored activations of a split are a function of (module docstring)."""
    digest = hashlib.sha256(encoder.fingerprint.encode())
    config = encoder.config
    architecture = {**config.portable().to_dict(), "dtype": config.dtype}
    digest.update(json.dumps(architecture, sort_keys=True).encode())
    for name in INPUTS:
        digest.update(np.ascontiguousarray(arrays[name], np.int32).tobytes())
    return digest.hexdigest()


class Layers:
    """A split's stored hidden states as one <float32>[N, J, L, H] array to index rows of:
    ``layers[rows]`` reads those rows of each file (memory-mapped) and stacks them."""

    def __init__(self, files: list[np.ndarray]):
        self.files = files
        n, length, hidden = files[0].shape
        self.shape, self.dtype, self.ndim = (n, len(files), length, hidden), np.float32, 4

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows) -> np.ndarray:
        return np.stack([np.asarray(f[rows]) for f in self.files], axis=1)


def _read_record(directory: str) -> dict:
    try:
        with open(os.path.join(directory, RECORD), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def stored(directory: str, encoder: Encoder, arrays: dict, indices: tuple[int, ...],
           batch_size: int) -> Layers:  # fmt: skip
    """The hidden states ``indices`` of the split ``arrays`` (``INPUTS`` <int32>[N, L]) as
    :class:`Layers`, from ``directory`` (one split's) where its record has them under this
    key, else computed now (in batches of ``batch_size``) and stored there first."""
    key = key_of(encoder, arrays)
    record = _read_record(directory)
    have = set(record.get("hidden_states", ())) if record.get("key") == key else set()
    missing = tuple(j for j in sorted(set(indices)) if j not in have)
    n, length = arrays["input_ids"].shape
    shape = (n, length, encoder.config.hidden_size)
    if missing:
        os.makedirs(directory, exist_ok=True)
        _write(directory, encoder, arrays, missing, batch_size, shape)
        done = sorted(have | set(missing))
        record = {"key": key, "hidden_states": done, "shape": list(shape)}
        atomic.write_text(os.path.join(directory, RECORD), json.dumps(record, indent=2) + "\n")
    files = [np.load(_path(directory, j), mmap_mode="r") for j in indices]
    return Layers(files)


def _path(directory: str, index: int) -> str:
    return os.path.join(directory, f"hidden_{index}.npy")


def _write(directory, encoder: Encoder, arrays, indices, batch_size, shape) -> None:
    """Runs the encoder once over the split, batch by batch, into one file per hidden state."""
    mesh = sh.create_mesh((1, 1, 1), jax.devices()[:1])  # as extract_features: one device
    config = kernel_check.checked(sh.bert_config_for(encoder.config, mesh), mesh,
                                  self_check.Shapes(shape[1], packed=0))  # fmt: skip
    params = jax.device_put(encoder.params, jax.devices()[0])
    temporary = {j: f"{_path(directory, j)}.tmp-{os.getpid()}" for j in indices}
    files = {j: np.lib.format.open_memmap(temporary[j], "w+", np.float32, shape) for j in indices}
    try:
        for start in range(0, shape[0], batch_size):
            rows = [arrays[name][start : start + batch_size] for name in INPUTS]
            real = len(rows[0])
            padded = [np.pad(r, ((0, batch_size - real), (0, 0))) for r in rows]  # one shape
            out = np.asarray(encode(config, tuple(indices), params, *padded))[:real]
            for k, j in enumerate(indices):
                files[j][start : start + real] = out[:, k]
        for j in indices:
            files[j].flush()
            del files[j]
            os.replace(temporary[j], _path(directory, j))
    finally:
        for path in temporary.values():
            if os.path.exists(path):
                os.remove(path)
