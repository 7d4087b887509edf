"""data_stats against statistics computed directly from parsed records / hand-made batches."""

import gzip
import itertools

import numpy as np
import pytest
import tensorflow as tf
from absl import flags

from bertjax import create_pretraining_data, data_stats
from bertjax.data import bundled, stats, tfrecords
from configs import base


class _Ids:
    mask_id, unk_id = 4, 1


def test_accumulator_on_a_hand_made_batch():
    batch = {
        # row 0: [CLS] 9 [MASK] 7 [SEP] pad ; row 1: [CLS] [UNK] 8 5 6 [SEP] (8 random for 11)
        "input_ids": np.array([[2, 9, 4, 7, 3, 0], [2, 1, 8, 5, 6, 3]]),
        "input_mask": np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]),
        "masked_lm_positions": np.array([[2, 3], [2, 4]]),
        "masked_lm_ids": np.array([[10, 7], [11, 6]]),
        "masked_lm_weights": np.array([[1.0, 1.0], [1.0, 1.0]]),
        "next_sentence_labels": np.array([1, 0]),
    }
    acc = stats.Accumulator(6, _Ids())
    acc.add(batch)
    s = acc.summary()
    assert s["examples"] == 2 and s["tokens"] == 11
    assert s["padding_fraction"] == pytest.approx(1 / 12)
    assert s["mask_rate"] == pytest.approx(4 / 11)
    assert s["mask_split"] == pytest.approx((0.25, 0.5, 0.25))
    assert s["not_next_fraction"] == 0.5 and s["truncation_rate"] is None
    assert s["unk_rate"] == pytest.approx(1 / 11)
    assert [n for _, _, n in s["length_histogram"]][-2:] == [1, 1]


def test_cli_on_tfrecords_matches_direct_computation(tmp_path, capsys):
    corpus = tmp_path / "c.txt.gz"
    with gzip.open(bundled.TRAIN_CORPUS, "rt") as f, gzip.open(corpus, "wt") as out:
        out.write("".join(itertools.islice(f, 400)))
    records = tmp_path / "r.tfrecord"
    values = flags.FlagValues()
    create_pretraining_data.define_flags(values)
    values(
        [
            "x",
            f"--input_file={corpus}",
            f"--output_file={records}",
            f"--vocab_file={bundled.VOCAB}",
            "--max_seq_length=64",
            "--max_predictions_per_seq=10",
            "--dupe_factor=1",
            "--num_workers=1",
        ]
    )
    assert create_pretraining_data.run(values) == 0
    capsys.readouterr()
    values = flags.FlagValues()
    data_stats.define_flags(values)
    values(
        [
            "x",
            f"--input_file={records}",
            f"--vocab_file={bundled.VOCAB}",
            "--max_seq_length=64",
            "--max_predictions_per_seq=10",
        ]
    )
    assert data_stats.run(values) == 0
    printed = capsys.readouterr().out
    spec = tfrecords.feature_spec(64, 10)
    parsed = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(str(records))]
    tokens = sum(int(p["input_mask"].numpy().sum()) for p in parsed)
    predictions = sum(int(p["masked_lm_weights"].numpy().sum()) for p in parsed)
    masked = sum(
        int(
            np.sum(
                p["input_ids"].numpy()[p["masked_lm_positions"].numpy()][
                    p["masked_lm_weights"].numpy() > 0
                ]
                == 4
            )
        )
        for p in parsed
    )
    assert f"examples            {len(parsed)}\n" in printed
    assert f"tokens              {tokens}  " in printed
    assert f"mask rate           {100 * predictions / tokens:.2f}%" in printed
    assert f"[MASK] {100 * masked / predictions:.1f}%" in printed


def test_online_pipeline_stats(tmp_path):
    corpus = tmp_path / "c.txt"
    with gzip.open(bundled.TRAIN_CORPUS, "rt") as f:
        corpus.write_text("".join(itertools.islice(f, 400)))
    config = base.get_config()
    config.data.input_files = [str(corpus)]
    config.data.cache_dir = str(tmp_path / "cache")
    summary = stats.pipeline_stats(config, "train", num_batches=4)
    assert summary["examples"] == 256
    assert 0.13 < summary["mask_rate"] < 0.17
    assert 0.0 <= summary["truncation_rate"] <= 1.0
    assert "length histogram" in stats.format_summary(summary)
