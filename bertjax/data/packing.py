"""Sequence packing: whole instances arranged into rows of the packed-row contract. No JAX.

The packed row itself is specified once, in ``bertjax.data.pipeline``'s docstring ("The packed
row"); this module decides which instances share a row and builds the row.

Algorithm: **best-fit decreasing** (BFD; Johnson, "Fast algorithms for bin packing", 1974) over
a bounded window of instances, with the two extra constraints of BERT rows. The window's
instances are visited longest first (ties: window order); each goes into the open row with the
least free token space that still takes it, else it opens a new row. A row takes an instance when

* its tokens stay within ``L`` = ``max_seq_length``,
* it holds fewer than ``K`` = ``max_sequences_per_pack`` instances, and
* its masked-LM predictions stay within ``P`` = ``max_predictions_per_seq``.

**The P-per-row rule**: a packed row keeps ``P`` as configured (the record layout does not change
with packing) and prediction count is the packer's second constraint. Masking is per instance and
unchanged, so an instance of ``n`` tokens brings ``min(P, max(1, round(n * masked_lm_prob)))``
predictions; at the paper's settings (128/20, 512/80, masked_lm_prob 0.15) a full row of 3
instances needs at most ``0.15 L + 1.5`` (19.2 + 1.5 at 128, 76.8 + 1.5 at 512), so the
constraint binds only for larger ``K`` or a larger ``masked_lm_prob`` than ``P`` allows for.
The row layout without cross-contamination is Krell et al.'s ("Efficient sequence packing
without cross-contamination", 2021, arXiv:2107.02027); their shortest-pack-first histogram
packing (SPFHP) packs a length histogram, while BFD works on the instances themselves, so the
prediction constraint is checked per instance, and it is deterministic: the same lengths and
predictions in the same order give the same rows.

Rows come out in window order (a row sits where its first instance was), and within a row the
instances keep window order, so packing keeps the upstream shuffle.

**Efficiency** = real tokens / token slots = ``tokens / (rows * L)`` (1 - the padding share). The
**ideal** is the same with the fewest rows any packing could use,
``max(ceil(tokens / L), ceil(instances / K), ceil(predictions / P), instances longer than L/2)``
(a lower bound: the best packing may need more rows, never fewer).
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from bertjax.data.instances import DataError

# Open rows a placement looks at beyond the best fit when the prediction constraint refuses it;
# bounds the work per instance (a refused instance opens a new row, which is still correct).
_MAX_CANDIDATES = 64


def pack(
    lengths: np.ndarray,
    predictions: np.ndarray,
    max_seq_length: int,
    max_sequences_per_pack: int,
    max_predictions_per_seq: int,
) -> list[list[int]]:
    """Best-fit decreasing. ``lengths``/``predictions`` ``<int>[n]`` (tokens and masked-LM
    predictions per instance) -> rows, each a list of instance indices in increasing order."""
    lengths, predictions = np.asarray(lengths, np.int64), np.asarray(predictions, np.int64)
    length, k, p = max_seq_length, max_sequences_per_pack, max_predictions_per_seq
    if np.any(lengths > length) or np.any(lengths < 1) or np.any(predictions > p):
        raise DataError(f"an instance does not fit a row of {length} tokens, {p} predictions")
    rows: list[list[int]] = []
    free_tokens, free_predictions = [], []
    open_rows: list[tuple[int, int]] = []  # (free tokens, row), sorted: best fit = first fit
    # A row that no instance could join leaves the open rows (the scan below never meets it).
    least_length = int(lengths.min()) if len(lengths) else 0
    least_predictions = int(predictions.min()) if len(predictions) else 0
    for i in np.argsort(-lengths, kind="stable").tolist():
        n, m = int(lengths[i]), int(predictions[i])
        start = bisect.bisect_left(open_rows, (n, -1))
        stop = min(len(open_rows), start + _MAX_CANDIDATES)
        found = next((j for j in range(start, stop) if free_predictions[open_rows[j][1]] >= m), -1)
        if found < 0:
            row = len(rows)
            rows.append([i])
            free_tokens.append(length - n)
            free_predictions.append(p - m)
        else:
            row = open_rows.pop(found)[1]
            rows[row].append(i)
            free_tokens[row] -= n
            free_predictions[row] -= m
        joinable = free_tokens[row] >= least_length and free_predictions[row] >= least_predictions
        if len(rows[row]) < k and joinable:
            bisect.insort(open_rows, (free_tokens[row], row))
    packed = [sorted(row) for row in rows]
    return sorted(packed, key=lambda row: row[0])


def minimum_rows(
    lengths: np.ndarray,
    predictions: np.ndarray,
    max_seq_length: int,
    max_sequences_per_pack: int,
    max_predictions_per_seq: int,
) -> int:
    """The fewest rows any packing of these instances could use (the module docstring's ideal)."""
    return max(
        int(np.sum(np.asarray(lengths) > max_seq_length // 2)),  # two of these never share a row
        math.ceil(int(np.sum(lengths)) / max_seq_length),
        math.ceil(len(lengths) / max_sequences_per_pack),
        math.ceil(int(np.sum(predictions)) / max_predictions_per_seq),
    )


def efficiency(lengths: np.ndarray, num_rows: int, max_seq_length: int) -> float:
    """Real tokens / token slots of ``num_rows`` rows holding instances of ``lengths``."""
    return int(np.sum(lengths)) / (num_rows * max_seq_length)


def pack_features(
    features: dict[str, np.ndarray], rows: list[list[int]], max_sequences_per_pack: int
) -> dict[str, np.ndarray]:
    """Unpacked instances -> packed rows of the contract (``bertjax.data.pipeline``).

    ``features``: the batch contract's unpacked features for ``n`` instances (``input_ids``,
    ``segment_ids``, ``input_mask <int>[n, L]``, ``masked_lm_* [n, P]``,
    ``next_sentence_labels [n]``); ``rows``: instance indices per row (``pack``). Returns the
    packed features, ``[R, L]``, ``[R, P]`` and ``[R, K]`` for ``R = len(rows)``.
    """
    input_mask = np.asarray(features["input_mask"])
    num_rows, (length, preds) = len(rows), (input_mask.shape[1], features["masked_lm_ids"].shape[1])
    k = max_sequences_per_pack
    out = {
        **{name: np.zeros((num_rows, length), np.int32) for name in _TOKEN_FEATURES},
        **{name: np.zeros((num_rows, preds), np.int32) for name in _PREDICTION_FEATURES},
        "masked_lm_weights": np.zeros((num_rows, preds), np.float32),
        **{name: np.zeros((num_rows, k), np.int32) for name in _INSTANCE_FEATURES},
        "next_sentence_weights": np.zeros((num_rows, k), np.float32),
    }
    num_tokens = input_mask.sum(axis=1)
    predicted = np.asarray(features["masked_lm_weights"]) > 0
    for r, row in enumerate(rows):
        if len(row) > k:
            raise DataError(f"a packed row of {len(row)} instances exceeds K={k}")
        start = filled = 0
        for s, i in enumerate(row):
            n, m = int(num_tokens[i]), int(predicted[i].sum())
            if start + n > length or filled + m > preds:
                raise DataError(f"packed row {r} exceeds {length} tokens or {preds} predictions")
            for name in ("input_ids", "segment_ids", "input_mask"):
                out[name][r, start : start + n] = features[name][i, :n]
            out["positions"][r, start : start + n] = np.arange(n)
            out["sequence_ids"][r, start : start + n] = s + 1
            sel = predicted[i]
            out["masked_lm_positions"][r, filled : filled + m] = (
                features["masked_lm_positions"][i, sel] + start
            )
            out["masked_lm_ids"][r, filled : filled + m] = features["masked_lm_ids"][i, sel]
            out["masked_lm_weights"][r, filled : filled + m] = 1.0
            out["next_sentence_positions"][r, s] = start
            out["next_sentence_labels"][r, s] = features["next_sentence_labels"][i]
            out["next_sentence_weights"][r, s] = 1.0
            start, filled = start + n, filled + m
    return out


_TOKEN_FEATURES = ("input_ids", "segment_ids", "input_mask", "positions", "sequence_ids")
_PREDICTION_FEATURES = ("masked_lm_positions", "masked_lm_ids")
_INSTANCE_FEATURES = ("next_sentence_positions", "next_sentence_labels")
