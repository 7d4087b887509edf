"""Masking against the original create_masked_lm_predictions rules (statistics + transcription)."""

import numpy as np
import pytest

from bertjax.data import masking

VOCAB_SIZE, PAD, CLS, SEP, MASK = 5000, 0, 2, 3, 4
SPECIALS = (0, 1, 2, 3, 4)


def _rows(num_rows=1200, length=128, seed=0):
    """[CLS] A [SEP] B [SEP] rows of random lengths (some short, as short_seq_prob makes)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, VOCAB_SIZE, size=(num_rows, length)).astype(np.int32)
    mask = np.zeros_like(ids)
    for r in range(num_rows):
        n = length if rng.random() < 0.8 else int(rng.integers(8, length))
        b = int(rng.integers(2, n - 2))
        ids[r, 0], ids[r, b], ids[r, n - 1] = CLS, SEP, SEP
        ids[r, n:] = PAD
        mask[r, :n] = 1
    return ids, mask


def _spec(**overrides):
    rng = np.random.default_rng(1)
    continuation = rng.random(VOCAB_SIZE) < 0.3
    continuation[list(SPECIALS)] = False
    base = dict(
        vocab_size=VOCAB_SIZE,
        mask_id=MASK,
        special_ids=SPECIALS,
        max_predictions_per_seq=20,
        is_continuation=continuation,
    )
    return masking.MaskingSpec(**{**base, **overrides})


def _reference_num_to_predict(num_tokens, spec):
    # The original: min(max_predictions_per_seq, max(1, int(round(len(tokens) * prob)))).
    return min(spec.max_predictions_per_seq, max(1, int(round(num_tokens * spec.masked_lm_prob))))


@pytest.mark.parametrize("rate,predictions", [(0.15, 20), (0.3, 40)], ids=["bert", "modernbert"])
def test_statistics_over_100k_tokens(rate, predictions):
    """The original's rules at BERT's rate and at ModernBERT's 30% (configs/modernbert_*.py):
    exact per-row counts, 80/10/10, [CLS], [SEP] and padding never masked."""
    ids, mask = _rows()
    spec = _spec(masked_lm_prob=rate, max_predictions_per_seq=predictions)
    out = masking.mask_batch(ids, mask, masking.hash_keys(7, np.arange(len(ids))), spec)
    weights = out["masked_lm_weights"] > 0
    assert mask.sum() > 100_000
    # Exact per-row counts of the original formula ([CLS]/[SEP] counted in len(tokens)).
    expected = [_reference_num_to_predict(n, spec) for n in mask.sum(axis=1)]
    np.testing.assert_array_equal(weights.sum(axis=1), expected)
    assert abs(weights.sum() / mask.sum() - rate) < 0.005
    positions, labels = out["masked_lm_positions"], out["masked_lm_ids"]
    rows = np.nonzero(weights)[0]
    at = out["input_ids"][rows, positions[weights]]
    original = ids[rows, positions[weights]]
    np.testing.assert_array_equal(labels[weights], original)
    assert not np.isin(original, SPECIALS).any()  # never a special token or padding
    assert abs((at == MASK).mean() - 0.8) < 0.01
    assert abs(((at == original) & (at != MASK)).mean() - 0.1) < 0.01
    assert abs(((at != original) & (at != MASK)).mean() - 0.1) < 0.01
    # Positions ascending, list padding zeroed, everything else untouched.
    for r in range(len(ids)):
        n = weights[r].sum()
        assert np.all(np.diff(positions[r, :n]) > 0) and np.all(positions[r, n:] == 0)
    untouched = np.ones_like(ids, dtype=bool)
    untouched[rows, positions[weights]] = False
    np.testing.assert_array_equal(out["input_ids"][untouched], ids[untouched])


def _reference_whole_word(ids_row, mask_row, key, spec):
    """The original greedy loop over whole words, visiting words in the order of the same
    random keys as the implementation (low 32 bits of the decision draw at the word start)."""
    decisions = masking.random_bits(np.array([key], dtype=np.uint64), len(ids_row), 1)[0]
    words, previous_candidate = [], False
    for i, (token, real) in enumerate(zip(ids_row, mask_row, strict=True)):
        candidate = bool(real) and token not in SPECIALS
        if candidate and previous_candidate and spec.is_continuation[token]:
            words[-1].append(i)
        elif candidate:
            words.append([i])
        previous_candidate = candidate
    words.sort(key=lambda w: (int(decisions[w[0]] & 0xFFFFFFFF), w[0]))
    num_to_predict = _reference_num_to_predict(int(mask_row.sum()), spec)
    chosen = []
    for word in words:
        if len(chosen) >= num_to_predict:
            break
        if len(chosen) + len(word) > num_to_predict:
            continue
        chosen.extend(word)
    return sorted(chosen), words


def test_whole_word_masking_matches_the_original_loop_and_never_splits_words():
    ids, mask = _rows(num_rows=300, seed=3)
    spec = _spec(do_whole_word_mask=True)
    keys = masking.hash_keys(11, np.arange(len(ids)))
    out = masking.mask_batch(ids, mask, keys, spec)
    for r in range(len(ids)):
        expected, words = _reference_whole_word(ids[r], mask[r], keys[r], spec)
        n = int(out["masked_lm_weights"][r].sum())
        got = out["masked_lm_positions"][r, :n].tolist()
        assert got == expected
        chosen = set(got)
        assert all(set(w) <= chosen or not set(w) & chosen for w in words)


def test_mask_depends_only_on_the_row_key():
    ids, mask = _rows(num_rows=64, seed=5)
    spec = _spec()
    keys = masking.hash_keys(0, np.arange(64))
    full = masking.mask_batch(ids, mask, keys, spec)
    part = masking.mask_batch(ids[10:20], mask[10:20], keys[10:20], spec)
    for name in part:
        np.testing.assert_array_equal(part[name], full[name][10:20])
    other = masking.mask_batch(ids, mask, masking.hash_keys(1, np.arange(64)), spec)
    assert not np.array_equal(other["masked_lm_positions"], full["masked_lm_positions"])


def test_ltr_targets_are_next_tokens():
    ids = np.array([[CLS, 10, 11, SEP, PAD]], dtype=np.int32)
    mask = np.array([[1, 1, 1, 1, 0]], dtype=np.int32)
    out = masking.ltr_targets(ids, mask)
    np.testing.assert_array_equal(out["input_ids"], ids)
    np.testing.assert_array_equal(out["masked_lm_positions"], [[0, 1, 2, 3, 4]])
    np.testing.assert_array_equal(out["masked_lm_ids"], [[10, 11, SEP, 0, 0]])
    np.testing.assert_array_equal(out["masked_lm_weights"], [[1, 1, 1, 0, 0]])


def test_continuation_table():
    table = masking.continuation_table(["[PAD]", "the", "##s", "x"], "wordpiece")
    np.testing.assert_array_equal(table, [False, False, True, False])
    table = masking.continuation_table(["[PAD]", "\u2581the", "s"], "sentencepiece")
    np.testing.assert_array_equal(table, [False, False, True])
