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
    bound = -(-tokens // 64)  # the fewest rows of 64 slots the tokens fit in
    assert (
        f"rows vs bound       {100 * bound / len(parsed):.1f}% efficient: ceil(tokens / L) = "
        f"{bound} rows\n" in printed
    )


@pytest.mark.parametrize("packed", [False, True])
def test_online_pipeline_stats(tmp_path, packed):
    """The first batches' statistics, and the whole split's rows against ceil(tokens / L),
    the tokens counted here from the instance table's rows: unpacked one row per instance;
    packed, the rows of one epoch of the packed stream (it visits each packed row once)."""
    from bertjax.data import pipeline, sources

    corpus = tmp_path / "c.txt"
    with gzip.open(bundled.TRAIN_CORPUS, "rt") as f:
        corpus.write_text("".join(itertools.islice(f, 400)))
    config = base.get_config()
    config.data.input_files = [str(corpus)]
    config.data.cache_dir = str(tmp_path / "cache")
    config.data.update(pack_sequences=packed, short_seq_prob=0.5)
    summary = stats.pipeline_stats(config, "train", num_batches=4)
    assert summary["examples"] >= 256 if packed else summary["examples"] == 256
    assert 0.13 < summary["mask_rate"] < 0.17
    assert 0.0 <= summary["truncation_rate"] <= 1.0
    table = sources.open_or_build(config.data, sources.create_tokenizer(config.data), "train", 0)
    tokens = int((table.read(np.arange(table.num_rows))[:, :128] > 0).sum())
    rows = table.num_rows
    if packed:  # one epoch of the stream: R positions, together every instance once
        stream = pipeline.create_pretrain_dataset(
            config.data, batch_size=1, seed=0, process_index=0, process_count=1
        ).as_numpy_iterator()
        rows, seen = 0, 0
        while seen < table.num_rows:
            seen += int(next(stream)["instance_weights"].sum())
            rows += 1
        assert seen == table.num_rows and rows < 0.9 * table.num_rows
    split, bound = summary["split"], -(-tokens // 128)
    assert (split["rows"], split["instances"], split["tokens"]) == (rows, table.num_rows, tokens)
    assert split["lower_bound_rows"] == bound <= rows
    printed = stats.format_summary(summary)
    assert "length histogram" in printed
    assert (
        f"whole split         {rows} rows of {table.num_rows} instances, padding "
        f"{100 - 100 * tokens / (128 * rows):.2f}%; {100 * bound / rows:.2f}% efficient: "
        f"ceil(tokens / L) = {bound} rows\n" in printed
    )


def test_accumulator_counts_instances_and_rows_of_packed_batches():
    batch = {
        # row 0: two instances [CLS] 9 [SEP] | [CLS] [MASK] [SEP], no padding; row 1: one
        # instance of 3 tokens, 3 padding slots; NotNext only for row 0's second instance.
        "input_ids": np.array([[2, 9, 3, 2, 4, 3], [2, 8, 3, 0, 0, 0]]),
        "input_mask": np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]]),
        "sequence_ids": np.array([[1, 1, 1, 2, 2, 2], [1, 1, 1, 0, 0, 0]]),
        "masked_lm_positions": np.array([[4, 0], [1, 0]]),
        "masked_lm_ids": np.array([[7, 0], [8, 0]]),
        "masked_lm_weights": np.array([[1.0, 0.0], [1.0, 0.0]]),
        "next_sentence_labels": np.array([[0, 1, 1], [0, 1, 0]]),  # list padding set on purpose
        "instance_weights": np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]),
    }
    acc = stats.Accumulator(6, _Ids())
    acc.add(batch, truncated=np.array([1, 0]))
    s = acc.summary()
    assert s["examples"] == 3 and s["rows"] == 2 and s["instances_per_row"] == 1.5
    assert s["tokens"] == 9 and s["padding_fraction"] == pytest.approx(3 / 12)
    assert s["not_next_fraction"] == pytest.approx(1 / 3)
    assert s["truncation_rate"] == pytest.approx(1 / 3)
    assert s["mask_split"] == pytest.approx((0.5, 0.5, 0.0))
    assert "rows                2  (1.50 instances per row)" in stats.format_summary(s)


def test_cli_on_packed_tfrecords_reports_instances_per_row(tmp_path, capsys):
    corpus = tmp_path / "c.txt.gz"
    with gzip.open(bundled.TRAIN_CORPUS, "rt") as f, gzip.open(corpus, "wt") as out:
        out.write("".join(itertools.islice(f, 400)))
    records = tmp_path / "r.tfrecord"
    values = flags.FlagValues()
    create_pretraining_data.define_flags(values)
    common = [f"--vocab_file={bundled.VOCAB}", "--max_seq_length=128"]
    values(
        ["x", f"--input_file={corpus}", f"--output_file={records}", *common]
        + ["--short_seq_prob=0.5", "--dupe_factor=1", "--num_workers=1", "--pack_sequences"]
    )
    assert create_pretraining_data.run(values) == 0
    written = capsys.readouterr().out
    values = flags.FlagValues()
    data_stats.define_flags(values)
    values(["x", f"--input_file={records}", *common])
    assert data_stats.run(values) == 0
    printed = capsys.readouterr().out
    spec = tfrecords.feature_spec(128, 20, 4)  # K by default: ceil(128 / 32)
    parsed = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(str(records))]
    instances = sum(int(p["instance_weights"].numpy().sum()) for p in parsed)
    tokens = sum(int(p["input_mask"].numpy().sum()) for p in parsed)
    assert instances > len(parsed)  # some rows hold several instances
    expected = (
        f"rows                {len(parsed)}  ({instances / len(parsed):.2f} instances per row)"
    )
    assert expected in printed and expected in written
    padding = 100 * (1 - tokens / (128 * len(parsed)))
    assert f"tokens              {tokens}  (padding {padding:.1f}%)" in printed
    assert f"examples            {instances}\n" in printed
    bound = -(-tokens // 128)
    assert f"rows vs bound       {100 * bound / len(parsed):.1f}% efficient" in printed
    # What bertjax.compile turns a step's slots into real tokens with: the same two figures.
    from bertjax.data import pipeline  # noqa: PLC0415

    data = base.get_config().data
    data.update(source="tfrecord", input_files=[str(records)], max_seq_length=128,
                max_predictions_per_seq=20, pack_sequences=True,
                max_sequences_per_pack=4)  # fmt: skip
    figures = pipeline.row_figures(data, seed=0)
    assert figures["instances_per_row"] == pytest.approx(instances / len(parsed))
    assert figures["fill"] == pytest.approx(tokens / (128 * len(parsed)))
