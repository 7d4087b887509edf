"""Pretraining TFRecords in the original BERT format: writing, checking and per-host reading.

Each record is a ``tf.train.Example`` with the features of the original ``run_pretraining.py``
``input_fn_builder``: ``input_ids``, ``input_mask``, ``segment_ids`` (int64 ``[L]``),
``masked_lm_positions``, ``masked_lm_ids`` (int64 ``[P]``), ``masked_lm_weights`` (float
``[P]``), ``next_sentence_labels`` (int64 ``[1]``; 0 = IsNext, 1 = NotNext). No JAX.
"""

from __future__ import annotations

import numpy as np

from bertjax.pretraining_data import DataError

INT_FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids")


def feature_spec(max_seq_length: int, max_predictions_per_seq: int) -> dict:
    """The original ``name_to_features`` parse spec."""
    import tensorflow as tf

    length, preds = max_seq_length, max_predictions_per_seq
    return {
        "input_ids": tf.io.FixedLenFeature([length], tf.int64),
        "input_mask": tf.io.FixedLenFeature([length], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([length], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([preds], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([preds], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([preds], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }


def serialize(features: dict[str, np.ndarray], row: int) -> bytes:
    """Row ``row`` of a batch dict (input_pipeline names) -> a serialized ``tf.train.Example``."""
    import tensorflow as tf

    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    feature = {name: ints(features[name][row].tolist()) for name in INT_FEATURES}
    feature["masked_lm_weights"] = tf.train.Feature(
        float_list=tf.train.FloatList(value=features["masked_lm_weights"][row].tolist())
    )
    feature["next_sentence_labels"] = ints([int(features["next_sentence_labels"][row])])
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    return example.SerializeToString()


def check_tfrecords(data_config, split: str = "train") -> list[str]:
    """Reads the first record; DataError if its lengths differ from ``config.data``."""
    import tensorflow as tf

    from bertjax.data_sources import resolve_files

    field = "input_files" if split == "train" else "eval_input_files"
    files = resolve_files(getattr(data_config, field), field)
    try:
        first = next(iter(tf.data.TFRecordDataset(files[0]).take(1)), None)
    except tf.errors.OpError as e:
        raise DataError(f"{files[0]}: not a readable TFRecord file ({e.message})") from None
    if first is None:
        raise DataError(f"{files[0]}: empty TFRecord file")
    example = tf.train.Example.FromString(first.numpy())
    expected = {
        "input_ids": ("max_seq_length", data_config.max_seq_length),
        "masked_lm_positions": ("max_predictions_per_seq", data_config.max_predictions_per_seq),
    }
    for name, (key, value) in expected.items():
        if name not in example.features.feature:
            raise DataError(f"{files[0]}: no feature {name!r}; not a BERT pretraining TFRecord")
        found = len(example.features.feature[name].int64_list.value)
        if found != value:
            raise DataError(
                f"{files[0]}: {name} has {found} values but data.{key}={value}; regenerate "
                f"the TFRecords or set data.{key}={found}"
            )
    return files


def parser(data_config):
    import tensorflow as tf

    spec = feature_spec(data_config.max_seq_length, data_config.max_predictions_per_seq)

    def parse(serialized):
        parsed = tf.io.parse_example(serialized, spec)
        batch = {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in parsed.items()}
        batch["next_sentence_labels"] = tf.reshape(batch["next_sentence_labels"], [-1])
        batch["example_weight"] = tf.ones_like(batch["next_sentence_labels"], tf.float32)
        return batch

    return parse


def _host_records(files: list[str], process_index: int, process_count: int):
    import tensorflow as tf

    if len(files) >= process_count:
        return tf.data.TFRecordDataset(files[process_index::process_count])
    return tf.data.TFRecordDataset(files).shard(process_count, process_index)


def _pad_rows(batch, valid):
    """Zeroes the padding rows of a finite split's last batch."""
    import tensorflow as tf

    out = {}
    for name, value in batch.items():
        shape = [-1] + [1] * (len(value.shape) - 1)
        out[name] = value * tf.cast(tf.reshape(valid, shape), value.dtype)
    return out


def tfrecord_dataset(
    data_config, *, batch_size, seed, process_index, process_count, split, start_batch
):
    """Per-host batches from TFRecords (see ``input_pipeline``'s docstring)."""
    import tensorflow as tf

    files = check_tfrecords(data_config, split)
    parse = parser(data_config)
    records = _host_records(files, process_index, process_count)
    if split == "train":
        records = records.repeat().shuffle(data_config.shuffle_buffer, seed=seed)
        batches = records.batch(batch_size, drop_remainder=True).skip(start_batch)
        return batches.map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    # Eval: every host counts every host's share so that all yield the same number of batches.
    counts = [sum(1 for _ in _host_records(files, h, process_count)) for h in range(process_count)]
    num_batches = max(1, -(-max(counts) // batch_size))
    # Pad rows reuse a real record's bytes (an empty Example fails FixedLenFeature) with weight 0.
    filler = next(iter(tf.data.TFRecordDataset(files[0]).take(1)))
    pad = tf.data.Dataset.from_tensors(filler).repeat().map(lambda r: (r, False))
    padded = records.map(lambda r: (r, True)).concatenate(pad)
    padded = padded.take(num_batches * batch_size).batch(batch_size).skip(start_batch)
    return padded.map(lambda r, valid: _pad_rows(parse(r), valid)).prefetch(tf.data.AUTOTUNE)
