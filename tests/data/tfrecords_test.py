"""TFRecord host shares: uneven files never stop a host; shares are disjoint and cover the data."""

import ml_collections
import numpy as np
import pytest
import tensorflow as tf

from bertjax.data import pipeline, tfrecords
from bertjax.data.instances import DataError
from configs import base

LENGTH, PREDICTIONS, BATCH = 8, 2, 2


def tf_example(features: dict[str, np.ndarray], row: int) -> bytes:
    """The reference: row ``row`` of a batch dict as TensorFlow's own protos serialize it."""

    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    feature = {name: ints(features[name][row].tolist()) for name in tfrecords.INT_FEATURES}
    feature["masked_lm_weights"] = tf.train.Feature(
        float_list=tf.train.FloatList(value=features["masked_lm_weights"][row].tolist())
    )
    labels = np.asarray(features["next_sentence_labels"][row]).reshape(-1)
    feature["next_sentence_labels"] = ints(labels.tolist())
    if "sequence_ids" in features:  # a packed row (the module docstring's packed record)
        for name in ("positions", "sequence_ids", "cls_positions"):
            feature[name] = ints(features[name][row].tolist())
        feature["instance_weights"] = tf.train.Feature(
            float_list=tf.train.FloatList(value=features["instance_weights"][row].tolist())
        )
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    return example.SerializeToString(deterministic=True)  # map keys sorted: same bytes every run


def _write(folder, sizes):
    """TFRecord files of ``sizes`` records; record ``r`` (numbered across files) has
    ``input_ids[1] == r``, so every row read back names its record."""
    paths, r = [], 0
    for f, size in enumerate(sizes):
        path = str(folder / f"part-{f}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for _ in range(size):
                features = {
                    "input_ids": np.array([[2, r, 3, 0, 0, 0, 0, 0]]),
                    "input_mask": np.array([[1, 1, 1, 0, 0, 0, 0, 0]]),
                    "segment_ids": np.zeros((1, LENGTH), np.int64),
                    "masked_lm_positions": np.array([[1, 0]]),
                    "masked_lm_ids": np.array([[r, 0]]),
                    "masked_lm_weights": np.array([[1.0, 0.0]]),
                    "next_sentence_labels": np.array([r % 2]),
                }
                writer.write(tf_example(features, 0))
                r += 1
        paths.append(path)
    return paths, r


def _config(paths):
    return ml_collections.ConfigDict(
        dict(
            source="tfrecord",
            input_files=paths,
            eval_input_files=paths,
            max_seq_length=LENGTH,
            max_predictions_per_seq=PREDICTIONS,
            shuffle_buffer=1,  # stream order = share order, so the test can follow records
        )
    )


def _records(config, split, host, hosts, batches):
    dataset = tfrecords.tfrecord_dataset(
        config,
        batch_size=BATCH,
        seed=0,
        process_index=host,
        process_count=hosts,
        split=split,
        start_batch=0,
    )
    out = list(dataset.take(batches).as_numpy_iterator())
    ids = np.concatenate([b["input_ids"][:, 1] for b in out]) if out else np.zeros(0, int)
    weights = np.concatenate([b["example_weight"] for b in out]) if out else np.zeros(0)
    return len(out), ids, weights


# (records per file, hosts): 1 file / 2 hosts, 3 unequal files / 2 hosts, a host whose file
# share is only an empty file, more hosts than files, an odd total.
CASES = [([7], 2), ([5, 1, 9], 2), ([6, 0, 3, 0], 2), ([4, 4], 3), ([0, 5, 0], 2), ([3, 10, 1], 4)]


@pytest.mark.parametrize("sizes,hosts", CASES)
def test_train_shares_are_infinite_disjoint_and_cover_everything(tmp_path, sizes, hosts):
    paths, total = _write(tmp_path, sizes)
    seen = []
    for host in range(hosts):
        count, ids, _ = _records(_config(paths), "train", host, hosts, 4 * total)
        assert count == 4 * total  # the train stream never ends, whatever the share
        seen.append(set(ids.tolist()))
    assert set().union(*seen) == set(range(total))
    assert sum(len(s) for s in seen) == total  # no record on two hosts


@pytest.mark.parametrize("sizes,hosts", CASES)
def test_eval_shares_are_equal_length_disjoint_and_cover_everything(tmp_path, sizes, hosts):
    paths, total = _write(tmp_path, sizes)
    counts, real = [], []
    for host in range(hosts):
        count, ids, weights = _records(_config(paths), "eval", host, hosts, 1000)
        counts.append(count)
        real.extend(ids[weights > 0].tolist())
    assert len(set(counts)) == 1  # every host runs the same number of eval steps
    assert sorted(real) == list(range(total))  # each record exactly once


def test_fewer_records_than_hosts_still_feeds_every_host(tmp_path):
    paths, _ = _write(tmp_path, [1, 0])
    for host in range(2):
        count, ids, _ = _records(_config(paths), "train", host, 2, 5)
        assert count == 5 and set(ids.tolist()) == {0}
    counts = [_records(_config(paths), "eval", h, 2, 100)[0] for h in range(2)]
    assert counts == [1, 1]


def test_only_empty_files_is_a_clear_error(tmp_path):
    paths, _ = _write(tmp_path, [0, 0])
    with pytest.raises(DataError, match="data.input_files: no records in"):
        tfrecords.check_tfrecords(_config(paths))


def test_fast_serializer_writes_protobufs_bytes():
    """``serialize_rows`` (hand-written wire format) against protobuf's own serialization."""
    rng = np.random.default_rng(0)
    rows = 64
    features = {
        "input_ids": rng.integers(0, 30522, (rows, 16)),
        "input_mask": rng.integers(0, 2, (rows, 16)),
        "segment_ids": rng.integers(0, 2, (rows, 16)),
        "masked_lm_positions": rng.integers(0, 16, (rows, 3)),
        "masked_lm_ids": rng.integers(0, 2**40, (rows, 3)),  # up to 6-byte varints
        "masked_lm_weights": rng.random((rows, 3)).astype(np.float32),
        "next_sentence_labels": rng.integers(0, 2, rows),
    }
    features["input_ids"][0, :6] = [0, 127, 128, 16383, 16384, 2**21]  # varint length edges
    features["masked_lm_ids"][1] = 0
    expected = [tf_example(features, r) for r in range(rows)]
    assert tfrecords.serialize_rows(features) == expected


def _packed_rows():
    """Two packed rows at L = 8, P = 2, K = 3: [CLS] 9 [SEP] | [CLS] 7 [SEP] 5 [SEP], and one."""
    return {
        "input_ids": np.array([[2, 9, 3, 2, 7, 3, 5, 3], [2, 6, 3, 0, 0, 0, 0, 0]]),
        "input_mask": np.array([[1] * 8, [1, 1, 1, 0, 0, 0, 0, 0]]),
        "segment_ids": np.array([[0, 0, 0, 0, 0, 0, 1, 1], [0] * 8]),
        "positions": np.array([[0, 1, 2, 0, 1, 2, 3, 4], [0, 1, 2, 0, 0, 0, 0, 0]]),
        "sequence_ids": np.array([[1, 1, 1, 2, 2, 2, 2, 2], [1, 1, 1, 0, 0, 0, 0, 0]]),
        "masked_lm_positions": np.array([[1, 4], [1, 0]]),
        "masked_lm_ids": np.array([[9, 7], [6, 0]]),
        "masked_lm_weights": np.array([[1.0, 1.0], [1.0, 0.0]], np.float32),
        "cls_positions": np.array([[0, 3, 0], [0, 0, 0]]),
        "next_sentence_labels": np.array([[1, 0, 0], [1, 0, 0]]),
        "instance_weights": np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], np.float32),
    }


def test_fast_serializer_writes_protobufs_bytes_for_packed_rows():
    rows = _packed_rows()
    assert tfrecords.serialize_rows(rows) == [tf_example(rows, r) for r in range(2)]


def _pipeline_config(path, **overrides):
    config = base.get_config().data
    config.update(
        source="tfrecord",
        input_files=[path],
        eval_input_files=[path],
        max_seq_length=LENGTH,
        max_predictions_per_seq=PREDICTIONS,
        shuffle_buffer=1,
        **overrides,
    )
    return config


def test_packed_records_give_packed_batches_and_must_agree_with_the_config(tmp_path):
    rows, path = _packed_rows(), str(tmp_path / "packed.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for r in range(2):
            writer.write(tf_example(rows, r))
    config = _pipeline_config(path, pack_sequences=True, max_sequences_per_pack=3)
    for split in ("train", "eval"):
        dataset = pipeline.create_pretrain_dataset(
            config, batch_size=2, seed=0, process_index=0, process_count=1, split=split
        )
        batch = next(pipeline.numpy_batches(dataset, config, split))
        for name, value in rows.items():
            np.testing.assert_array_equal(batch[name], value, err_msg=name)
            assert batch[name].dtype == (np.float32 if value.dtype == np.float32 else np.int32)
        np.testing.assert_array_equal(batch["example_weight"], [1.0, 1.0])
        assert set(pipeline.PACKED_FEATURES) <= set(batch)
    with pytest.raises(
        DataError,
        match="packed.tfrecord holds packed records of up to 3 instances: set"
        " data.pack_sequences=True and data.max_sequences_per_pack=3",
    ):
        pipeline.check_data_config(_pipeline_config(path))
    with pytest.raises(DataError, match="data.max_sequences_per_pack=3$"):
        pipeline.check_data_config(
            _pipeline_config(path, pack_sequences=True, max_sequences_per_pack=4)
        )
    with pytest.raises(DataError, match="data.max_sequences_per_pack=0: need >= 1"):
        pipeline.check_data_config(_pipeline_config(path, max_sequences_per_pack=0))
    unpacked, _ = _write(tmp_path, [2])
    with pytest.raises(
        DataError, match="data.pack_sequences=True but .*part-0.tfrecord holds unpacked"
    ):
        pipeline.check_data_config(_pipeline_config(unpacked[0], pack_sequences=True))
    pipeline.check_data_config(_pipeline_config(unpacked[0]))  # unpacked, as today


def test_packed_records_of_the_earlier_names_are_one_line_naming_the_file(tmp_path):
    """Packed records written before the packed row had one set of names (their
    ``next_sentence_positions``/``next_sentence_weights``, now ``cls_positions``/
    ``instance_weights``) are refused in one line naming the file and saying to rebuild them,
    whether the config says packed or not: by the config check (``bertjax.main``,
    ``bertjax.compile``), the pipeline, and ``data_stats``; never read silently."""
    from bertjax.data import stats  # noqa: PLC0415

    rows, path = _packed_rows(), str(tmp_path / "earlier.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for r in range(2):
            example = tf.train.Example.FromString(tf_example(rows, r))
            feature = example.features.feature
            for old, new in (("next_sentence_positions", "cls_positions"),
                             ("next_sentence_weights", "instance_weights")):  # fmt: skip
                feature[old].CopyFrom(feature[new])
                del feature[new]
            writer.write(example.SerializeToString())
    message = (
        f"^{path}: packed records of an earlier bertjax .* rebuild them with "
        "create_pretraining_data --pack_sequences$"
    )
    for packed in (True, False):
        config = _pipeline_config(path, pack_sequences=packed, max_sequences_per_pack=3)
        with pytest.raises(DataError, match=message):
            pipeline.check_data_config(config)
        with pytest.raises(DataError, match=message):
            pipeline.create_pretrain_dataset(
                config, batch_size=2, seed=0, process_index=0, process_count=1, split="eval"
            )
    with pytest.raises(DataError, match=message):
        stats.tfrecord_stats([path], config, tokenizer=None)
