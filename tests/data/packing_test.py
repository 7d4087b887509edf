"""The packer against hand-counted packings, and the packed row against a hand-made one."""

import numpy as np
import pytest

from bertjax.data import packing
from bertjax.data.instances import DataError


def _check_bounds(rows, lengths, predictions, length, k, p):
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))  # each once
    for row in rows:
        assert row == sorted(row) and 1 <= len(row) <= k
        assert sum(lengths[i] for i in row) <= length
        assert sum(predictions[i] for i in row) <= p


@pytest.mark.parametrize("length,k,p", [(128, 3, 20), (512, 3, 80), (128, 8, 20), (64, 2, 5)])
def test_rows_respect_every_bound_and_are_deterministic(length, k, p):
    rng = np.random.default_rng(length + k)
    lengths = rng.integers(5, length + 1, size=3000)
    predictions = np.minimum(p, np.maximum(1, np.round(lengths * 0.15))).astype(int)
    rows = packing.pack(lengths, predictions, length, k, p)
    _check_bounds(rows, lengths.tolist(), predictions.tolist(), length, k, p)
    assert rows == packing.pack(lengths.copy(), predictions.copy(), length, k, p)
    assert [row[0] for row in rows] == sorted(row[0] for row in rows)  # rows in window order


def test_known_histograms_pack_as_counted_by_hand():
    # 100 x 100 + 100 x 28 at 128: each long one gets a short one, no slot empty.
    lengths = [100] * 100 + [28] * 100
    rows = packing.pack(lengths, [1] * 200, 128, 3, 20)
    assert len(rows) == 100 and packing.efficiency(lengths, len(rows), 128) == 1.0
    assert packing.minimum_rows(lengths, [1] * 200, 128, 3, 20) == 100
    # 50 x 70 + 50 x 60 at 128: 70 + 60 > 128, so the best is 50 rows of one 70 and 25 rows of two
    # 60s (75 rows), above the token bound ceil(6500 / 128) = 51.
    lengths = [70] * 50 + [60] * 50
    rows = packing.pack(lengths, [1] * 100, 128, 3, 20)
    assert len(rows) == 75
    assert packing.efficiency(lengths, 75, 128) == pytest.approx(6500 / (75 * 128))
    assert packing.minimum_rows(lengths, [1] * 100, 128, 3, 20) == 51
    # K binds: 300 x 10 tokens, 3 per row -> 100 rows; predictions bind: 8 each, P = 20 -> 2.
    assert len(packing.pack([10] * 300, [1] * 300, 128, 3, 20)) == 100
    assert packing.minimum_rows([10] * 300, [1] * 300, 128, 3, 20) == 100
    assert len(packing.pack([10] * 300, [8] * 300, 128, 3, 20)) == 150
    assert packing.minimum_rows([10] * 300, [8] * 300, 128, 3, 20) == 120  # ceil(2400 / 20)
    # Over half a row each: no two share one, whatever the token count says (ceil(650 / 128) = 6).
    assert len(packing.pack([65] * 10, [1] * 10, 128, 3, 20)) == 10
    assert packing.minimum_rows([65] * 10, [1] * 10, 128, 3, 20) == 10


def test_efficiency_reaches_the_ideal_where_a_perfect_packing_exists():
    # Pairs (a, 128 - a) with a uniform in [5, 123], shuffled: a packing with no padding exists
    # (efficiency 1.0, the ideal: 5000 rows). Longest first, each short one's best fit is a row
    # holding its complement, so BFD finds it; the first-fit order would not.
    rng = np.random.default_rng(0)
    long = rng.integers(5, 124, size=5000)
    lengths = np.concatenate([long, 128 - long])
    rng.shuffle(lengths)
    predictions = np.minimum(20, np.maximum(1, np.round(lengths * 0.15))).astype(int)
    rows = packing.pack(lengths, predictions, 128, 3, 20)
    assert packing.minimum_rows(lengths, predictions, 128, 3, 20) == 5000
    assert len(rows) == 5000 and packing.efficiency(lengths, len(rows), 128) == 1.0


def test_an_instance_over_the_bounds_is_an_error():
    with pytest.raises(DataError, match="does not fit a row of 128 tokens, 20 predictions"):
        packing.pack([129], [1], 128, 3, 20)
    with pytest.raises(DataError, match="does not fit"):
        packing.pack([10], [21], 128, 3, 20)


def test_pack_features_builds_the_contracts_row():
    # Three unpacked instances at L = 8, P = 3 (ids: CLS 2, SEP 3, MASK 4), with a regression
    # label per instance and a tagger's label per token beside the pretraining features.
    features = {
        "input_ids": np.array(
            [[2, 4, 3, 9, 3, 0, 0, 0], [2, 7, 3, 0, 0, 0, 0, 0], [2, 5, 4, 3, 0, 0, 0, 0]]
        ),
        "segment_ids": np.array([[0, 0, 0, 1, 1, 0, 0, 0], [0] * 8, [0, 0, 0, 0, 0, 0, 0, 0]]),
        "input_mask": np.array(
            [[1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0]]
        ),
        "masked_lm_positions": np.array([[1, 0, 0], [1, 0, 0], [2, 0, 0]]),
        "masked_lm_ids": np.array([[8, 7, 0], [7, 0, 0], [6, 0, 0]]),
        "masked_lm_weights": np.array([[1.0, 0, 0], [1.0, 0, 0], [1.0, 0, 0]]),
        "next_sentence_labels": np.array([0, 1, 1]),
        "scores": np.array([0.5, 2.5, 4.0], np.float32),
        "tags": np.array(
            [[0, 5, 6, 7, 8, 9, 9, 9], [0, 4, 0, 9, 9, 9, 9, 9], [0, 3, 2, 1, 9, 9, 9, 9]]
        ),
    }
    out = packing.pack_features(features, [[0, 1], [2]], max_sequences_per_pack=3)
    np.testing.assert_array_equal(
        out["input_ids"], [[2, 4, 3, 9, 3, 2, 7, 3], [2, 5, 4, 3, 0, 0, 0, 0]]
    )
    np.testing.assert_array_equal(out["segment_ids"], [[0, 0, 0, 1, 1, 0, 0, 0], [0] * 8])
    np.testing.assert_array_equal(out["input_mask"], [[1] * 8, [1, 1, 1, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(
        out["positions"], [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 2, 3, 0, 0, 0, 0]]
    )
    np.testing.assert_array_equal(
        out["sequence_ids"], [[1, 1, 1, 1, 1, 2, 2, 2], [1, 1, 1, 1, 0, 0, 0, 0]]
    )
    # Instance 0's second id slot (7) is list padding (weight 0): it is left out.
    np.testing.assert_array_equal(out["masked_lm_positions"], [[1, 6, 0], [2, 0, 0]])
    np.testing.assert_array_equal(out["masked_lm_ids"], [[8, 7, 0], [6, 0, 0]])
    np.testing.assert_array_equal(out["masked_lm_weights"], [[1, 1, 0], [1, 0, 0]])
    np.testing.assert_array_equal(out["cls_positions"], [[0, 5, 0], [0, 0, 0]])
    np.testing.assert_array_equal(out["next_sentence_labels"], [[0, 1, 0], [1, 0, 0]])
    np.testing.assert_array_equal(out["instance_weights"], [[1, 1, 0], [1, 0, 0]])
    np.testing.assert_array_equal(out["scores"], [[0.5, 2.5, 0], [4.0, 0, 0]])
    assert out["scores"].dtype == np.float32 and out["instance_weights"].dtype == np.float32
    np.testing.assert_array_equal(out["tags"], [[0, 5, 6, 7, 8, 0, 4, 0], [0, 3, 2, 1, 0, 0, 0, 0]])
    assert set(out) == {*features, *packing.ROW_FEATURES}
    with pytest.raises(DataError, match="packed row 0 exceeds 8 tokens"):
        packing.pack_features(features, [[0, 2]], max_sequences_per_pack=3)
    features["masked_lm_weights"] = np.array([[1.0, 1, 0], [1.0, 1, 0], [1.0, 0, 0]])
    with pytest.raises(DataError, match="packed row 1 exceeds 3 predictions"):
        packing.pack_features(features, [[2], [0, 1]], max_sequences_per_pack=3)
    with pytest.raises(DataError, match="2 instances exceeds K=1"):
        packing.pack_features(features, [[0, 1]], max_sequences_per_pack=1)
