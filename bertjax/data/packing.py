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

**K, the slots of a row** (``data.max_sequences_per_pack``): by default one per
``TOKENS_PER_SLOT`` = 32 tokens, ``ceil(L / 32)``, 4 at 128 and 16 at 512 (``configs/base.py``,
``default_pack_width``). Short instances (stubs, a document's last piece) have about the same
length at any L, so the number a row can take grows with L; a fixed K = 3 (NVIDIA's MLPerf
BERT) left 17.0% of the slots as padding at 512 on a corpus of many short documents, where
K = 16 leaves 0.6% (docs/benchmarks.md, "Sequence packing"). An empty slot costs one [CLS]
query of the gathered last layer and nothing else.

**The P-per-row rule**: a packed row keeps ``P`` as configured (the record layout does not change
with packing) and prediction count is the packer's second constraint. Masking is per instance and
unchanged, so an instance of ``n`` tokens brings ``min(P, max(1, round(n * masked_lm_prob)))``
predictions; a full row of ``k`` instances needs at most ``0.15 L + k / 2`` at masked_lm_prob
0.15, which can pass the paper's P (20 at 128, 80 at 512) by up to ``K / 2``: the constraint
can bind. It does not in practice, since the instances' rounding goes up and down: on the
Wikipedia-like corpus and on the one of many short documents, at 128 and at 512 with the
default K, a budget of 1,000 predictions per row packs exactly the same rows as the paper's P
(``pipeline.pack_table``'s rows, docs/benchmarks.md). So P stays the paper's, per row.
The row layout without cross-contamination is Krell et al.'s ("Efficient sequence packing
without cross-contamination", 2021, arXiv:2107.02027); their shortest-pack-first histogram
packing (SPFHP) packs a length histogram, while BFD works on the instances themselves, so the
prediction constraint is checked per instance, and it is deterministic: the same lengths and
predictions in the same order give the same rows.

Rows come out in window order (a row sits where its first instance was), and within a row the
instances keep window order, so packing keeps the upstream shuffle.

**Efficiency** = real tokens / token slots = ``tokens / (rows * L)`` (1 - the padding share).
Against the **lower bound** ``ceil(tokens / L)`` rows (no packing of these tokens can use fewer):
``lower_bound_rows / rows`` (``bertjax.data.stats``). The **ideal** is the same with the fewest
rows any packing could use under every constraint of the row,
``max(ceil(tokens / L), ceil(instances / K), ceil(predictions / P), instances longer than L/2)``
(a lower bound too: the best packing may need more rows, never fewer).
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from bertjax.data.instances import DataError

TOKENS_PER_SLOT = 32  # the default K is one slot per this many tokens (module docstring)


def default_pack_width(max_seq_length: int) -> int:
    """``K`` by default: ``ceil(max_seq_length / TOKENS_PER_SLOT)`` (``configs/base.py``'s rule)."""
    return -(-int(max_seq_length) // TOKENS_PER_SLOT)


def lower_bound_rows(tokens: int, max_seq_length: int) -> int:
    """The fewest rows of ``max_seq_length`` slots that ``tokens`` real tokens fit in."""
    return -(-int(tokens) // int(max_seq_length))


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
    """Unpacked instances -> packed rows of the contract (``bertjax.data.pipeline``, "The packed
    row"): the one builder of pretraining, fine-tuning and feature extraction.

    ``features``: ``n`` unpacked instances, each feature of one of three kinds:

    * ``masked_lm_*`` ``[n, P]`` (named ``PREDICTION_FEATURES``): each instance's predictions
      (weight > 0), one instance's after another, positions moved to the row; then 0;
    * per instance, ``[n]`` (``next_sentence_labels``, a classifier's ``label_ids``): one per
      slot, ``[R, K]``; then 0;
    * per token, ``[n, L]`` (``input_ids``, ``segment_ids``, ``input_mask``, a tagger's
      ``label_ids``/``label_weights``): each instance's first ``input_mask.sum()`` tokens, one
      instance after another; then 0.

    ``rows``: instance indices per row (``pack``). Returns those features packed, dtypes kept, and
    ``ROW_FEATURES``: ``positions``, ``sequence_ids <int32>[R, L]``, ``cls_positions
    <int32>[R, K]``, ``instance_weights <float32>[R, K]``, for ``R = len(rows)``.
    """
    num_tokens = np.asarray(features["input_mask"]).sum(axis=1).astype(np.int64)
    length, k = np.shape(features["input_mask"])[1], max_sequences_per_pack
    if any(len(row) > k for row in rows):
        raise DataError(f"a packed row of {max(map(len, rows))} instances exceeds K={k}")
    # Instance j of the concatenated rows: its row, slot and first token in the row.
    members = np.asarray([i for row in rows for i in row], np.int64)
    row_of = np.repeat(np.arange(len(rows)), [len(row) for row in rows])
    slot = np.arange(len(members)) - np.repeat(_row_starts(rows), [len(row) for row in rows])
    n = num_tokens[members]
    start = _offsets_within_rows(n, row_of)
    if np.any(start + n > length):
        raise DataError(f"packed row {int(row_of[start + n > length][0])} exceeds {length} tokens")
    tokens = np.arange(length)[None, :] < n[:, None]  # [m, L]: the instance's real tokens
    token_rows, token_columns = np.repeat(row_of, n), (start[:, None] + np.arange(length))[tokens]
    out = {
        "positions": np.zeros((len(rows), length), np.int32),
        "sequence_ids": np.zeros((len(rows), length), np.int32),
        "cls_positions": np.zeros((len(rows), k), np.int32),
        "instance_weights": np.zeros((len(rows), k), np.float32),
    }
    out["positions"][token_rows, token_columns] = np.nonzero(tokens)[1]
    out["sequence_ids"][token_rows, token_columns] = np.repeat(slot + 1, n)
    out["cls_positions"][row_of, slot] = start
    out["instance_weights"][row_of, slot] = 1.0
    if "masked_lm_weights" in features:
        out.update(_pack_predictions(features, members, row_of, start, len(rows)))
    for name, value in features.items():
        value = np.asarray(value)
        if name in PREDICTION_FEATURES:
            continue
        if value.ndim == 1:
            out[name] = np.zeros((len(rows), k), value.dtype)
            out[name][row_of, slot] = value[members]
        else:
            out[name] = np.zeros((len(rows), length), value.dtype)
            out[name][token_rows, token_columns] = value[members][tokens]
    return out


def _row_starts(rows: list[list[int]]) -> np.ndarray:
    """Each row's first index into the concatenated rows."""
    return np.cumsum([0, *(len(row) for row in rows)])[:-1].astype(np.int64)


def _offsets_within_rows(sizes: np.ndarray, row_of: np.ndarray) -> np.ndarray:
    """``<int64>[m]``: where each item starts in its row, the items of a row one after another
    (``row_of`` non-decreasing)."""
    ends = np.cumsum(sizes)
    first = np.searchsorted(row_of, row_of, side="left")  # the row's first item
    return ends - sizes - (ends[first] - sizes[first])


def _pack_predictions(features, members, row_of, start, num_rows) -> dict[str, np.ndarray]:
    """The ``masked_lm_*`` features of the rows (``pack_features``)."""
    predicted = np.asarray(features["masked_lm_weights"])[members] > 0  # [m, P]
    preds = predicted.shape[1]
    count = predicted.sum(axis=1)
    filled = _offsets_within_rows(count, row_of)
    if np.any(filled + count > preds):
        raise DataError(
            f"packed row {int(row_of[filled + count > preds][0])} exceeds {preds} predictions"
        )
    rank = np.cumsum(predicted, axis=1) - 1
    rows, columns = np.nonzero(predicted)
    target = (row_of[rows], filled[rows] + rank[rows, columns])
    out = {}
    for name in PREDICTION_FEATURES:
        value = np.asarray(features[name])
        out[name] = np.zeros((num_rows, preds), value.dtype)
        out[name][target] = value[members][rows, columns]
    out["masked_lm_positions"][target] += start[rows].astype(out["masked_lm_positions"].dtype)
    out["masked_lm_weights"][target] = 1
    return out


# What ``pack_features`` adds to a row (the batch contract's packed row).
ROW_FEATURES = ("positions", "sequence_ids", "cls_positions", "instance_weights")
PREDICTION_FEATURES = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
