"""Feature extraction: per-token activations of chosen layers, like Google's extract_features.py.

The library behind ``python -m bertjax.extract_features`` (``bertjax/extract_features.py``: its
flags) and the paper's feature-based approach (§5.3). :func:`extract` is the whole job.

Input: one sequence per line, ``A ||| B`` for a pair (every line is an example, blank ones too,
as in the original). Output: one JSON object per input line, the original script's format::

    {"linex_index": i, "features": [{"token": "[CLS]",
                                      "layers": [{"index": -1, "values": [...]}, ...]}, ...]}

Layer ``-1`` is the last encoder layer and ``-num_layers`` the first (the original indexes only
encoder layers, not the embeddings; non-negative ``j`` is layer ``j + 1``). Values are rounded
with ``round(x, 6)`` as the original. A pair is truncated to ``max_seq_length - 3`` word pieces by
popping from the longer side (``B`` on ties), a single sequence to ``max_seq_length - 2``.

``--checkpoint`` is a bertjax params-only checkpoint or a HF directory (converted in memory by
``bertjax.interop``). The forward pass is jitted once for ``[batch_size, max_seq_length]``; the
last batch is padded. Rows are the packed row of ``bertjax.data.pipeline`` (built by its one
builder, ``bertjax.data.packing.pack_features``), one example each; with ``--pack_sequences`` up
to ``--max_sequences_per_pack`` whole examples (``bertjax.data.packing.pack``, over windows of
``batch_size * max_sequences_per_pack * 4`` examples in input order), each attending only to
itself with its own positions, and the output is what it is unpacked: the same lines, in the
same order, every value equal up to float32 rounding (``tests/commands/extract_features_test``).
The output file is written atomically (``bertjax.atomic``). Every path may be on ``gs://``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from bertjax import atomic
from bertjax.data import packing
from bertjax.interop import formats
from bertjax.interop.converted import Converted, ConvertError, read_lines
from bertjax.model.attention import self_check
from bertjax.model.config import BertConfig
from bertjax.model.encoder import BertEncoder
from bertjax.training import kernel_check
from bertjax.training import sharding as sh

_PAIR_RE = re.compile(r"^(.*) \|\|\| (.*)$")


class ExtractError(ValueError):
    """Bad input file, flag or checkpoint for feature extraction."""


@dataclasses.dataclass
class Feature:
    """One example: tokens (with [CLS]/[SEP]) and its <int32>[L] model inputs."""

    unique_id: int
    tokens: list[str]
    input_ids: list[int]
    segment_ids: list[int]


def read_examples(input_file: str) -> list[tuple[str, str | None]]:
    """Lines -> (text_a, text_b or None); ``A ||| B`` splits a pair as the original regex does."""
    if not input_file or not epath.Path(input_file).exists():  # epath reads "" as "."
        raise ExtractError(f"--input_file={input_file}: file not found")
    examples = []
    for line in read_lines(input_file):
        line = line.strip()
        match = _PAIR_RE.match(line)
        examples.append((match.group(1), match.group(2)) if match else (line, None))
    return examples


def truncate_seq_pair(tokens_a: list, tokens_b: list, max_length: int) -> None:
    """Pops from the longer list (``tokens_b`` on ties) until the total fits, in place."""
    while len(tokens_a) + len(tokens_b) > max_length:
        (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()


def build_features(examples, tokenizer, max_seq_length: int) -> list[Feature]:
    """Tokenizes, truncates and adds [CLS]/[SEP] (segment 0 for A, 1 for B), like the original."""
    pieces_a = tokenizer.encode([a for a, _ in examples])
    pieces_b = iter(tokenizer.encode([b for _, b in examples if b is not None]))
    features = []
    for unique_id, ((_, text_b), ids_a) in enumerate(zip(examples, pieces_a, strict=True)):
        ids_b = list(next(pieces_b)) if text_b is not None else []
        ids_a = list(ids_a)
        if text_b is not None:
            truncate_seq_pair(ids_a, ids_b, max_seq_length - 3)
        else:
            ids_a = ids_a[: max_seq_length - 2]
        input_ids = [tokenizer.cls_id, *ids_a, tokenizer.sep_id]
        segment_ids = [0] * len(input_ids)
        if text_b is not None:
            input_ids += [*ids_b, tokenizer.sep_id]
            segment_ids += [1] * (len(ids_b) + 1)
        tokens = tokenizer.convert_ids_to_tokens(input_ids)
        features.append(Feature(unique_id, tokens, input_ids, segment_ids))
    return features


def hidden_state_positions(layers: list[int], num_layers: int) -> list[int]:
    """Original layer indexes -> positions in ``EncoderOutput.hidden_states`` (embeddings at 0)."""
    positions = []
    for index in layers:
        if not -num_layers <= index < num_layers:
            raise ExtractError(f"--layers: index {index} is out of range for a {num_layers}-layer "
                               f"model (expected -{num_layers}..{num_layers - 1})")  # fmt: skip
        positions.append(index + 1 if index >= 0 else num_layers + 1 + index)
    return positions


@functools.partial(jax.jit, static_argnums=(0, 1))
def _forward(config: BertConfig, layers: tuple[int, ...], params, input_ids, segment_ids,
             sequence_ids, positions) -> jax.Array:  # fmt: skip
    """<int32>[B, L] x4 -> <float32>[B, K, L, H] activations of the K chosen layers."""
    out = BertEncoder(config).apply({"params": params}, input_ids, segment_ids, sequence_ids,
                                    output_hidden_states=True, positions=positions)  # fmt: skip
    return jnp.stack([out.hidden_states[p] for p in layers], axis=1).astype(jnp.float32)


_INPUTS = ("input_ids", "segment_ids", "sequence_ids", "positions")  # what _forward reads


def _windows(features: list[Feature], batch_size: int, max_seq_length: int, pack: int):
    """Yields (rows, arrays) per window of ``batch_size * pack * 4`` examples: ``rows`` the
    examples of each row, one each or up to ``pack`` (``bertjax.data.packing.pack``, in input
    order within the window), and ``arrays`` the packed row's ``_INPUTS`` of those rows,
    ``<int32>[R, L]`` (``bertjax.data.packing.pack_features``, the one builder)."""
    from bertjax.data import packing  # noqa: PLC0415

    k = max(pack, 1)
    window = batch_size * k * 4
    for start in range(0, len(features), window):
        chunk = features[start : start + window]
        unpacked = {name: np.zeros((len(chunk), max_seq_length), np.int32)
                    for name in ("input_ids", "segment_ids", "input_mask")}  # fmt: skip
        for i, feature in enumerate(chunk):
            n = len(feature.input_ids)
            unpacked["input_ids"][i, :n] = feature.input_ids
            unpacked["segment_ids"][i, :n] = feature.segment_ids
            unpacked["input_mask"][i, :n] = 1
        lengths = unpacked["input_mask"].sum(axis=1)
        no_predictions = np.zeros_like(lengths)  # nothing is masked here: only L and K bind
        groups = packing.pack(lengths, no_predictions, max_seq_length, k, 1)
        arrays = packing.pack_features(unpacked, groups, k)
        yield [[chunk[i] for i in group] for group in groups], [arrays[n] for n in _INPUTS]


def _batches(windows, batch_size: int):
    """Windows (``_windows``) -> (rows, arrays) of ``batch_size`` rows each, ``arrays`` the
    ``_INPUTS`` ``<int32>[batch_size, L]`` (the last batch padded with empty rows)."""
    rows, arrays = [], None
    for window_rows, window_arrays in windows:
        rows += window_rows
        if arrays is None:
            arrays = window_arrays
        else:
            arrays = [np.concatenate(pair) for pair in zip(arrays, window_arrays, strict=True)]
        while len(rows) >= batch_size:
            yield rows[:batch_size], np.stack([a[:batch_size] for a in arrays])
            rows, arrays = rows[batch_size:], [a[batch_size:] for a in arrays]
    if rows:
        padding = ((0, batch_size - len(rows)), (0, 0))
        yield rows, np.stack([np.pad(a, padding) for a in arrays])


def _json_line(feature: Feature, activations: np.ndarray, layers: list[int]) -> str:
    """<float32>[K, L, H] activations of one example -> the original script's JSON line."""
    tokens = []
    for i, token in enumerate(feature.tokens):
        tokens.append({"token": token, "layers": [
            {"index": index, "values": [round(float(x), 6) for x in activations[k, i]]}
            for k, index in enumerate(layers)
        ]})  # fmt: skip
    return json.dumps({"linex_index": feature.unique_id, "features": tokens}) + "\n"


def _validate(conv: Converted, max_seq_length: int, batch_size: int, vocab_size: int):
    if not 3 <= max_seq_length <= conv.config.max_position_embeddings:
        limit = conv.config.max_position_embeddings
        raise ExtractError(f"--max_seq_length={max_seq_length}: expected 3..{limit}")
    if batch_size < 1:
        raise ExtractError(f"--batch_size={batch_size}: expected a positive integer")
    if vocab_size > conv.config.vocab_size:
        raise ExtractError(f"--vocab_file: {vocab_size} tokens, but the checkpoint's embedding has "
                           f"{conv.config.vocab_size} rows")  # fmt: skip


def extract(checkpoint: str, input_file: str, output_file: str, layers: list[int],
            max_seq_length: int = 128, batch_size: int = 8, vocab_file: str | None = None,
            do_lower_case: bool | None = None, pack: bool = False,
            max_sequences_per_pack: int = 0) -> int:  # fmt: skip
    """Writes the JSON lines for every line of ``input_file``; returns the number written."""
    import tensorflow as tf  # noqa: PLC0415 - heavy; only the tokenizer needs it

    from bertjax.data.tokenization import WordPieceTokenizer  # noqa: PLC0415

    try:
        tf.config.set_visible_devices([], "GPU")  # TensorFlow only tokenizes; keep it off the GPU.
    except RuntimeError:  # TF already initialised its devices in this process: leave them.
        pass
    try:
        conv = formats.load(checkpoint, do_lower_case=do_lower_case)
    except ConvertError as e:
        raise ExtractError(f"--checkpoint: {e}") from None
    casing = conv.do_lower_case if do_lower_case is None else do_lower_case
    tokenizer = WordPieceTokenizer(vocab_file or conv.vocab_file, casing)
    _validate(conv, max_seq_length, batch_size, tokenizer.vocab_size)
    if pack and max_sequences_per_pack == 0:  # the configs' default, K = ceil(L / 32)
        max_sequences_per_pack = packing.default_pack_width(max_seq_length)
    if pack and max_sequences_per_pack < 1:
        raise ExtractError(
            f"--max_sequences_per_pack={max_sequences_per_pack}: expected a positive integer"
        )
    positions = tuple(hidden_state_positions(layers, conv.config.num_layers))
    features = build_features(read_examples(input_file), tokenizer, max_seq_length)
    params = jax.device_put(conv.params["encoder"])
    mesh = sh.create_mesh((1, 1, 1), jax.devices()[:1])
    shapes = self_check.Shapes(max_seq_length, packed=max_sequences_per_pack if pack else 0)
    config = kernel_check.checked(sh.bert_config_for(conv.config, mesh), mesh, shapes)
    windows = _windows(features, batch_size, max_seq_length, max_sequences_per_pack if pack else 0)
    done: dict[int, str] = {}  # lines computed ahead of their turn (packing reorders a window)
    written = 0
    with atomic.writer(output_file, "w") as f:
        for chunk, arrays in _batches(windows, batch_size):
            out = np.asarray(_forward(config, positions, params, *arrays))
            for row, examples in enumerate(chunk):
                offset = 0
                for feature in examples:
                    n = len(feature.input_ids)
                    done[feature.unique_id] = _json_line(
                        feature, out[row][:, offset : offset + n], layers
                    )
                    offset += n
            while written in done:
                f.write(done.pop(written))
                written += 1
    return written
