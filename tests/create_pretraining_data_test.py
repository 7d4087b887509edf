"""The offline tool end to end; records parsed with the original run_pretraining.py spec."""

import gzip
import itertools

import numpy as np
import pytest
import tensorflow as tf
from absl import flags

from bertjax import create_pretraining_data, data

LENGTH, PREDICTIONS = 64, 10


def _original_input_fn_features(max_seq_length, max_predictions_per_seq):
    # Written like google-research/bert run_pretraining.py's input_fn_builder name_to_features.
    return {
        "input_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "input_mask": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([max_predictions_per_seq], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }


def _run(argv):
    values = flags.FlagValues()  # private flags: never clash with other tools in this process
    create_pretraining_data.define_flags(values)
    values(["create_pretraining_data", *argv])
    return create_pretraining_data.run(values)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("c") / "corpus.txt.gz"
    with gzip.open(data.TRAIN_CORPUS, "rt") as f, gzip.open(path, "wt") as out:
        out.write("".join(itertools.islice(f, 800)))
    return path


def test_writes_shards_the_original_spec_parses(corpus, tmp_path, capsys):
    out = tmp_path / "out" / "train.tfrecord"
    code = _run(
        [
            f"--input_file={corpus}",
            f"--output_file={out}",
            "--num_output_shards=2",
            f"--vocab_file={data.VOCAB}",
            f"--max_seq_length={LENGTH}",
            f"--max_predictions_per_seq={PREDICTIONS}",
            "--dupe_factor=2",
            "--random_seed=7",
        ]
    )
    assert code == 0
    shards = sorted((tmp_path / "out").iterdir())
    assert [p.name for p in shards] == [f"train.tfrecord-0000{i}-of-00002" for i in range(2)]
    spec = _original_input_fn_features(LENGTH, PREDICTIONS)
    records = [
        tf.io.parse_single_example(r, spec)
        for r in tf.data.TFRecordDataset([str(p) for p in shards])
    ]
    assert len(records) > 200
    assert f"examples            {len(records)}" in capsys.readouterr().out
    labels = []
    for record in records:
        r = {k: v.numpy() for k, v in record.items()}
        n = int(r["input_mask"].sum())
        assert np.all(r["input_mask"][:n] == 1) and np.all(r["input_ids"][n:] == 0)
        weights = r["masked_lm_weights"] > 0
        positions = r["masked_lm_positions"][weights]
        assert np.all(np.diff(positions) > 0) and np.all(positions < n)
        assert not np.isin(r["masked_lm_ids"][weights], [0, 1, 2, 3, 4]).any()
        assert r["input_ids"][0] == 2 and r["input_ids"][n - 1] == 3
        labels.append(int(r["next_sentence_labels"][0]))
    assert set(labels) == {0, 1}
    assert 0.4 < np.mean(labels) < 0.6  # small sample; the precise balance is tested elsewhere


def test_bad_input_exits_non_zero_and_leaves_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe not text\n")
    out = tmp_path / "out.tfrecord"
    code = _run([f"--input_file={bad}", f"--output_file={out}", f"--vocab_file={data.VOCAB}"])
    assert code == 1
    assert "bad.txt: not UTF-8 text" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [bad]
    assert _run([f"--output_file={out}", f"--vocab_file={data.VOCAB}"]) == 1
    assert "--input_file is required" in capsys.readouterr().err
