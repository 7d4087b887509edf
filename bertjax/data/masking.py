"""Seeded BERT masked-LM masking on numpy batches with static shapes (no JAX, no TensorFlow).

The rule is the original ``create_pretraining_data.py``'s ``create_masked_lm_predictions``:

* candidates are all real tokens except ``[CLS]``/``[SEP]`` (and padding); with whole-word
  masking a candidate is a whole word: a word start plus the continuation pieces after it
  (``##x`` for WordPiece, pieces without ``▁`` for SentencePiece), never crossing a special token;
* candidates are visited in a random order; ``num_to_predict = min(max_predictions_per_seq,
  max(1, round(num_tokens * masked_lm_prob)))`` with ``num_tokens`` counting [CLS]/[SEP]; a word
  that would overshoot ``num_to_predict`` is skipped and later (shorter) ones are still tried;
* each chosen token independently: 80% ``[MASK]``, 10% kept, 10% a uniformly random vocab id
  (per token, also inside a whole word, as the original does);
* predictions are listed in position order and padded to ``max_predictions_per_seq`` with
  position 0, id 0, weight 0.

Randomness is counter-based: every draw is a hash of ``(seed, row_key, position, stream)``, so a
row's mask depends only on its key, never on the batch it sits in, the batch size or the number of
hosts. Dynamic masking keys rows by their position in the stream (fresh masks every epoch);
static masking keys them by their index in the instance table (the same mask every epoch).
"""

from __future__ import annotations

import dataclasses

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)

# Independent random streams drawn for every (row, position): one 64-bit draw supplies the visiting
# order (low 32 bits), the 80% [MASK] decision (bits 32-47) and the keep-vs-random coin (bit 48);
# a second draw picks the random replacement id.
STREAM_DECISIONS, STREAM_RANDOM_ID = 1, 2
_MASK_THRESHOLD = np.uint64(round(0.8 * (1 << 16)))


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, elementwise on ``<uint64>[...]`` (a bijective 64-bit mixer)."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= _MIX1
    x ^= x >> np.uint64(27)
    x *= _MIX2
    x ^= x >> np.uint64(31)
    return x


def hash_keys(*parts) -> np.ndarray:
    """Chains integers / integer arrays (broadcast together) into ``<uint64>[...]`` keys."""
    with np.errstate(over="ignore"):
        key = np.uint64(0x5DEECE66D)
        for part in parts:
            part = np.asarray(part).astype(np.uint64)
            key = splitmix64(key * _GOLDEN + part + np.uint64(1))
    return key


def random_bits(row_keys: np.ndarray, length: int, stream: int) -> np.ndarray:
    """``<uint64>[R, length]`` random bits for ``<uint64>[R]`` row keys and one stream."""
    positions = np.arange(length, dtype=np.uint64)
    return hash_keys(row_keys[:, None], positions[None, :], stream)


def uniform(row_keys: np.ndarray, length: int, stream: int) -> np.ndarray:
    """``<float64>[R, length]`` uniforms in [0, 1) (53-bit) for ``<uint64>[R]`` row keys."""
    bits = random_bits(row_keys, length, stream)
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


@dataclasses.dataclass(frozen=True)
class MaskingSpec:
    """What masking needs to know about the vocab and the objective."""

    vocab_size: int
    mask_id: int
    special_ids: tuple[int, ...]  # never masked ([CLS], [SEP], [PAD], ...)
    max_predictions_per_seq: int
    masked_lm_prob: float = 0.15
    do_whole_word_mask: bool = False
    # <bool>[vocab_size]: True for a piece that continues the previous word ('##x'). Only read
    # when do_whole_word_mask is set.
    is_continuation: np.ndarray | None = None


def continuation_table(vocab: list[str], kind: str) -> np.ndarray:
    """``<bool>[V]``: pieces that continue a word (WordPiece ``##x``; SentencePiece: no ``▁``;
    byte-level BPE: no ``Ġ``)."""
    if kind == "wordpiece":
        return np.array([t.startswith("##") for t in vocab], dtype=bool)
    if kind == "sentencepiece":
        return np.array([not t.startswith("\u2581") and not t.startswith("[") for t in vocab])
    if kind == "bpe":  # byte-level BPE: 'Ġ' marks a piece after a space
        return np.array([not t.startswith("\u0120") and not t.startswith("[") for t in vocab])
    raise ValueError(f"tokenizer kind {kind!r}: expected 'wordpiece', 'sentencepiece' or 'bpe'")


def _word_starts(input_ids, candidate, spec: MaskingSpec) -> np.ndarray:
    """<bool>[R, L]: candidate positions that open a new masking unit (token or whole word)."""
    if not spec.do_whole_word_mask:
        return candidate
    continues = spec.is_continuation[input_ids]
    previous_candidate = np.zeros_like(candidate)
    previous_candidate[:, 1:] = candidate[:, :-1]
    return candidate & ~(continues & previous_candidate)


def _choose(starts, unit_length, num_to_predict, order_keys) -> np.ndarray:
    """Greedy in random order, skipping units that would overshoot. -> <bool>[R, L] chosen starts.

    Args:
      starts: <bool>[R, L] unit starts; unit_length: <int64>[R, L] length of the unit at a start.
      num_to_predict: <int64>[R]; order_keys: <int64>[R, L] random keys in [0, 2**32).
    """
    rows, length = starts.shape
    # Unique sort keys (ties broken by position); non-starts sort after every start.
    keys = np.where(starts, order_keys, 1 << 32) * length + np.arange(length)[None, :]
    if not np.any(unit_length[starts] > 1):  # all units are one token: the n smallest keys
        n = np.clip(num_to_predict, 1, length)
        threshold = np.take_along_axis(np.sort(keys, axis=1), (n - 1)[:, None], axis=1)
        return starts & (keys <= threshold)
    # The original's "continue" makes this sequential over units; it is vectorised over rows.
    order = np.argsort(keys, axis=1)
    sorted_length = np.take_along_axis(np.where(starts, unit_length, 0), order, axis=1)
    taken = np.zeros(sorted_length.shape, dtype=bool)
    running = np.zeros_like(num_to_predict)
    for rank in range(int(starts.sum(axis=1).max(initial=0))):
        unit = sorted_length[:, rank]
        fits = (unit > 0) & (running + unit <= num_to_predict)
        taken[:, rank] = fits
        running += np.where(fits, unit, 0)
    chosen = np.zeros_like(starts)
    np.put_along_axis(chosen, order, taken, axis=1)
    return chosen & starts


def max_predictions(num_tokens: np.ndarray, spec: MaskingSpec) -> np.ndarray:
    """``<int64>[R]``: the most predictions :func:`mask_batch` makes in rows of ``num_tokens``
    real tokens (exactly its ``num_to_predict``; whole-word masking may choose fewer)."""
    # np.round is round-half-to-even, exactly like the original's Python 3 round().
    counts = np.maximum(1, np.round(np.asarray(num_tokens) * spec.masked_lm_prob).astype(np.int64))
    return np.minimum(spec.max_predictions_per_seq, counts)


def mask_batch(
    input_ids: np.ndarray, input_mask: np.ndarray, row_keys: np.ndarray, spec: MaskingSpec
) -> dict[str, np.ndarray]:
    """Masks a batch. Shapes: ``input_ids <int32>[R, L]``, ``input_mask <int32>[R, L]``,
    ``row_keys <uint64>[R]``.

    Returns ``input_ids <int32>[R, L]`` (masked), ``masked_lm_positions <int32>[R, P]``,
    ``masked_lm_ids <int32>[R, P]`` (the original tokens), ``masked_lm_weights <float32>[R, P]``
    with ``P = spec.max_predictions_per_seq``.
    """
    rows, length = input_ids.shape
    real = input_mask.astype(bool)
    candidate = real & ~np.isin(input_ids, np.asarray(spec.special_ids))
    starts = _word_starts(input_ids, candidate, spec)
    # A unit spans from its start up to the next start or non-candidate; `length` is a sentinel
    # unit for non-candidates so that every row has a fixed number of unit slots.
    unit_of = np.where(candidate, np.cumsum(starts, axis=1) - 1, length)
    flat_unit = (np.arange(rows)[:, None] * (length + 1) + unit_of).ravel()
    unit_sizes = np.bincount(flat_unit, minlength=rows * (length + 1)).reshape(rows, length + 1)
    unit_length = np.take_along_axis(unit_sizes, np.where(starts, unit_of, length), axis=1)
    num_to_predict = max_predictions(real.sum(axis=1), spec)
    decisions = random_bits(row_keys, length, STREAM_DECISIONS)
    order_keys = (decisions & np.uint64(0xFFFFFFFF)).astype(np.int64)  # ties: lowest position
    chosen_starts = _choose(starts, unit_length, num_to_predict, order_keys)
    chosen_units = np.zeros((rows, length + 1), dtype=bool)
    np.put_along_axis(chosen_units, np.where(chosen_starts, unit_of, length), True, axis=1)
    chosen_units[:, length] = False
    chosen = np.take_along_axis(chosen_units, unit_of, axis=1)
    return _apply(input_ids, chosen, decisions, row_keys, spec)


def _apply(input_ids, chosen, decisions, row_keys, spec: MaskingSpec) -> dict[str, np.ndarray]:
    """80/10/10 replacement at ``chosen <bool>[R, L]`` and the padded prediction lists."""
    rows, length = input_ids.shape
    to_mask = ((decisions >> np.uint64(32)) & np.uint64(0xFFFF)) < _MASK_THRESHOLD
    keep = ((decisions >> np.uint64(48)) & np.uint64(1)).astype(bool)
    random_ids = np.minimum(
        (uniform(row_keys, length, STREAM_RANDOM_ID) * spec.vocab_size).astype(np.int64),
        spec.vocab_size - 1,
    )
    replacement = np.where(to_mask, spec.mask_id, np.where(keep, input_ids, random_ids))
    masked_ids = np.where(chosen, replacement, input_ids).astype(np.int32)
    num_predictions = spec.max_predictions_per_seq
    # np.nonzero walks rows in order and positions ascending: slot = rank within the row.
    row_index, position = np.nonzero(chosen)
    count = chosen.sum(axis=1)
    slot = np.arange(len(row_index)) - np.repeat(np.cumsum(count) - count, count)
    positions = np.zeros((rows, num_predictions), dtype=np.int32)
    positions[row_index, slot] = position
    weights = np.arange(num_predictions)[None, :] < count[:, None]
    labels = np.where(weights, np.take_along_axis(input_ids, positions, axis=1), 0)
    return {
        "input_ids": masked_ids,
        "masked_lm_positions": positions,
        "masked_lm_ids": labels.astype(np.int32),
        "masked_lm_weights": weights.astype(np.float32),
    }


def ltr_targets(input_ids: np.ndarray, input_mask: np.ndarray) -> dict[str, np.ndarray]:
    """Left-to-right LM targets: predict token ``i + 1`` at every position ``i``.

    ``<int32>[R, L]`` in; the lists have ``P = L``: positions ``0..L-1``, ids = next token,
    weight 1 where the next token is real. Inputs are left unmasked.
    """
    rows, length = input_ids.shape
    next_ids = np.zeros_like(input_ids)
    next_ids[:, :-1] = input_ids[:, 1:]
    next_real = np.zeros_like(input_mask)
    next_real[:, :-1] = input_mask[:, 1:]
    return {
        "input_ids": input_ids.astype(np.int32),
        "masked_lm_positions": np.broadcast_to(
            np.arange(length, dtype=np.int32), (rows, length)
        ).copy(),
        "masked_lm_ids": np.where(next_real > 0, next_ids, 0).astype(np.int32),
        "masked_lm_weights": next_real.astype(np.float32),
    }
