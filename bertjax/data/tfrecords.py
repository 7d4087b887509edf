"""Pretraining TFRecords in the original BERT format: writing, checking and per-host reading.

Each record is a ``tf.train.Example`` with the features of the original ``run_pretraining.py``
``input_fn_builder``: ``input_ids``, ``input_mask``, ``segment_ids`` (int64 ``[L]``),
``masked_lm_positions``, ``masked_lm_ids`` (int64 ``[P]``), ``masked_lm_weights`` (float
``[P]``), ``next_sentence_labels`` (int64 ``[1]``; 0 = IsNext, 1 = NotNext). No JAX.

A **packed** record (``create_pretraining_data --pack_sequences``; the packed row of
``bertjax.data.pipeline``'s batch contract, ``bertjax.data.packing``) has those features with
their meaning over the row, ``masked_lm_*`` holding every instance's predictions as row
positions, ``next_sentence_labels`` with ``K`` values (int64 ``[K]``, one per instance, then 0),
and adds the packed row's names: ``positions``, ``sequence_ids`` (int64 ``[L]``),
``cls_positions`` (int64 ``[K]``) and ``instance_weights`` (float ``[K]``). Records are read as
packed when the first one has ``sequence_ids``, with ``K`` the length of its
``next_sentence_labels``; a record without ``sequence_ids`` (every record of Google's script, or
ours unpacked) is one instance. Packed records of bertjax before the packed row had one set of
names (``next_sentence_positions``/``next_sentence_weights``) are a one-line error naming the
file: rebuild them.
"""

from __future__ import annotations

import contextlib
import re

import numpy as np

from bertjax.data.instances import DataError

INT_FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids")
# The config key that sets each feature's length (next_sentence_labels always has 1 value).
_LENGTH_KEYS = {
    "input_ids": "max_seq_length",
    "input_mask": "max_seq_length",
    "segment_ids": "max_seq_length",
    "masked_lm_positions": "max_predictions_per_seq",
    "masked_lm_ids": "max_predictions_per_seq",
    "masked_lm_weights": "max_predictions_per_seq",
    "positions": "max_seq_length",
    "sequence_ids": "max_seq_length",
}


PACKED_INT_FEATURES = ("positions", "sequence_ids", "cls_positions")
# The packed features of records written before the packed row had one set of names.
_EARLIER_PACKED_FEATURES = ("next_sentence_positions", "next_sentence_weights")


def feature_spec(
    max_seq_length: int, max_predictions_per_seq: int, max_sequences_per_pack: int | None = None
) -> dict:
    """The original ``name_to_features`` parse spec; with ``max_sequences_per_pack`` (``K``) the
    packed record's (module docstring)."""
    import tensorflow as tf

    length, preds = max_seq_length, max_predictions_per_seq
    if max_sequences_per_pack is not None:
        k = max_sequences_per_pack
        return {
            **feature_spec(length, preds),
            "positions": tf.io.FixedLenFeature([length], tf.int64),
            "sequence_ids": tf.io.FixedLenFeature([length], tf.int64),
            "cls_positions": tf.io.FixedLenFeature([k], tf.int64),
            "next_sentence_labels": tf.io.FixedLenFeature([k], tf.int64),
            "instance_weights": tf.io.FixedLenFeature([k], tf.float32),
        }
    return {
        "input_ids": tf.io.FixedLenFeature([length], tf.int64),
        "input_mask": tf.io.FixedLenFeature([length], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([length], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([preds], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([preds], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([preds], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL_VARINTS = [_encode_varint(n) for n in range(1 << 14)]  # every length prefix we write


def _varint(n: int) -> bytes:
    return _SMALL_VARINTS[n] if n < 1 << 14 else _encode_varint(n)


def _packed_varints(values: np.ndarray) -> list[bytes]:
    """``<int>[R, n]`` (non-negative) -> each row's values as protobuf varints, vectorised."""
    v = values.astype(np.uint64)
    width = max(1, -(-int(v.max(initial=0)).bit_length() // 7))  # 7-bit groups of the largest
    shifts = np.arange(width, dtype=np.uint64) * np.uint64(7)
    groups = ((v[..., None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)  # [R, n, width]
    nbytes = 1 + sum((v >= np.uint64(1 << (7 * k))).astype(np.int64) for k in range(1, width))
    nbytes = np.broadcast_to(nbytes, v.shape)
    position = np.arange(width)
    groups |= ((position < nbytes[..., None] - 1) * 0x80).astype(np.uint8)  # continuation bits
    encoded = groups[position < nbytes[..., None]].tobytes()
    ends = np.cumsum(nbytes.sum(axis=1)).tolist()
    return [encoded[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=True)]


def _map_entry(name: str, list_tag: bytes, payload: bytes) -> bytes:
    """One ``Features.feature`` map entry: key ``name``, value a Feature holding one packed
    Int64List (``list_tag`` 0x1A) or FloatList (0x12)."""
    values = b"\x0a" + _varint(len(payload)) + payload  # the list's packed `value` field
    feature = list_tag + _varint(len(values)) + values
    key = name.encode()
    entry = b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(len(feature)) + feature
    return b"\x0a" + _varint(len(entry)) + entry


def serialize_rows(features: dict[str, np.ndarray]) -> list[bytes]:
    """Every row of a batch dict -> its serialized ``tf.train.Example``: the wire format written
    directly (map entries in key order, as protobuf's deterministic serialization writes them),
    ~10x faster than building the protos. Int features must be non-negative. Packed rows (with
    ``sequence_ids``) get the packed record's features (module docstring)."""
    rows = len(features["input_ids"])
    packed = "sequence_ids" in features
    int_names = (*INT_FEATURES, "next_sentence_labels", *(PACKED_INT_FEATURES if packed else ()))
    float_names = ("masked_lm_weights", *(("instance_weights",) if packed else ()))
    payloads = {
        name: _packed_varints(np.asarray(features[name]).reshape(rows, -1)) for name in int_names
    }
    for name in float_names:
        payloads[name] = [row.tobytes() for row in np.asarray(features[name], dtype="<f4")]
    out = []
    for r in range(rows):
        body = b"".join(
            _map_entry(name, b"\x12" if name in float_names else b"\x1a", payloads[name][r])
            for name in sorted(payloads)
        )
        out.append(b"\x0a" + _varint(len(body)) + body)
    return out


def check_tfrecords(data_config, split: str = "train") -> list[str]:
    """The split's files; DataError naming the file unless its first record has every feature of
    ``feature_spec`` with the type and length ``config.data`` implies (``record_layout``)."""
    return record_layout(data_config, split)[0]


def record_layout(data_config, split: str = "train") -> tuple[list[str], int | None]:
    """Reads the first record: -> (the split's files, ``K`` when the records are packed else
    None); DataError naming its file unless it has every feature of ``feature_spec`` with the
    type and length ``config.data`` implies."""
    import tensorflow as tf
    from google.protobuf.message import DecodeError

    from bertjax.data.sources import resolve_files

    field = "input_files" if split == "train" else "eval_input_files"
    files = resolve_files(getattr(data_config, field), field)
    path, first = _first_record(files)
    if first is None:
        raise DataError(f"data.{field}: no records in {files}")
    try:
        features = tf.train.Example.FromString(first).features.feature
    except DecodeError:
        raise DataError(f"{path}: the first record is not a tf.train.Example") from None
    pack_size = _pack_size(features, path)
    spec = feature_spec(data_config.max_seq_length, data_config.max_predictions_per_seq, pack_size)
    for name, feature in spec.items():
        if name not in features:
            raise DataError(f"{path}: no feature {name!r}; not a BERT pretraining TFRecord")
        kind = "float_list" if feature.dtype == tf.float32 else "int64_list"
        found_kind = features[name].WhichOneof("kind") or "empty"
        if found_kind != kind:
            raise DataError(f"{path}: feature {name!r} is {found_kind}, expected {kind}")
        found, expected = len(getattr(features[name], kind).value), feature.shape[0]
        if found != expected:
            key = _LENGTH_KEYS.get(name)
            fix = (
                f"regenerate the TFRecords or set data.{key}={found}"
                if key
                else "not a BERT pretraining TFRecord"
            )
            where = f"data.{key}={expected}" if key else f"the record's layout has {expected}"
            raise DataError(f"{path}: {name} has {found} values but {where}; {fix}")
    return files, pack_size


def _pack_size(features, path: str) -> int | None:
    """A record's ``K`` if it is packed (it has ``sequence_ids``: the length of its NSP list);
    DataError naming ``path`` for a packed record of the earlier names."""
    if "sequence_ids" not in features:
        return None
    earlier = [name for name in _EARLIER_PACKED_FEATURES if name in features]
    if earlier:
        raise DataError(
            f"{path}: packed records of an earlier bertjax ({', '.join(earlier)}; the packed row "
            "now has cls_positions and instance_weights): rebuild them with "
            "create_pretraining_data --pack_sequences"
        )
    return len(features["next_sentence_labels"].int64_list.value)


def pack_size_of(files: list[str]) -> int | None:
    """``K`` of the records in ``files`` (read from the first), None when they are unpacked."""
    import tensorflow as tf

    path, first = _first_record(files)
    if first is None:
        return None
    return _pack_size(tf.train.Example.FromString(first).features.feature, path)


def parser(data_config, max_sequences_per_pack: int | None = None):
    """-> ``parse(serialized <string>[B]) -> batch`` (the batch contract); packed records
    (``max_sequences_per_pack`` = their ``K``, from ``record_layout``) give the packed row."""
    import tensorflow as tf

    packed = max_sequences_per_pack is not None
    spec = feature_spec(
        data_config.max_seq_length, data_config.max_predictions_per_seq, max_sequences_per_pack
    )

    def parse(serialized):
        began = tf.timestamp()
        with tf.control_dependencies([began]):
            parsed = tf.io.parse_example(serialized, spec)
        batch = {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in parsed.items()}
        if not packed:
            batch["next_sentence_labels"] = tf.reshape(batch["next_sentence_labels"], [-1])
        batch["example_weight"] = tf.ones_like(batch["input_ids"][:, 0], tf.float32)
        with tf.control_dependencies(list(batch.values())):
            # The batch contract's host work (bertjax.data.pipeline): here, parsing.
            batch["host_seconds"] = tf.cast(tf.timestamp() - began, tf.float32)
        return batch

    return parse


@contextlib.contextmanager
def _naming_files(data_config, split: str):
    """A record that cannot be read or parsed (a corrupt or truncated file, a feature of another
    length or type than the first record's) -> a DataError naming the input files, not a
    ``tf.errors`` traceback."""
    import tensorflow as tf

    from bertjax.data.sources import resolve_files

    try:
        yield
    except tf.errors.OpError as e:
        field = "input_files" if split == "train" else "eval_input_files"
        files = resolve_files(getattr(data_config, field), field)
        raise DataError(f"data.{field} {files}: cannot read a record ({_tf_message(e)})") from None


def _tf_message(error) -> str:
    """A ``tf.errors`` message's first line without the graph node before it and the op after."""
    message = (error.message or type(error).__name__).splitlines()[0]
    message = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", message)
    return re.sub(r"\s*\[Op:\w+\].*$", "", message)


def named_read_errors(batches, data_config, split: str):
    """``batches`` (numpy batches of ``tfrecord_dataset``) with errors named (``_naming_files``)."""
    while True:
        with _naming_files(data_config, split):
            try:
                batch = next(batches)
            except StopIteration:
                return
        yield batch


def _first_record(files: list[str]) -> tuple[str, bytes | None]:
    """(file, serialized record) of the first record in ``files`` (None if all are empty)."""
    import tensorflow as tf

    for path in files:
        try:
            for record in tf.data.TFRecordDataset(path).take(1):
                return path, record.numpy()
        except tf.errors.OpError as e:
            raise DataError(f"{path}: not a readable TFRecord file ({_tf_message(e)})") from None
    return files[-1], None


def file_level_sharding(files: list[str], process_count: int) -> bool:
    """Whether every host's file share ``files[h::process_count]`` has a non-empty file.

    An empty TFRecord file has zero bytes and a file with a record has more, so sizes decide
    without reading: a host with no files or only empty ones would stop (and hang the others).
    """
    import tensorflow as tf

    if len(files) < process_count:
        return False
    sizes = [tf.io.gfile.stat(f).length for f in files]
    return all(any(sizes[h::process_count]) for h in range(process_count))


def host_records(files: list[str], process_index: int, process_count: int, *, repeat: bool):
    """This host's share of the serialized records, never empty when ``repeat``.

    * every host has a non-empty file share: files ``h::process_count`` (reads 1/N of the bytes);
    * else, with at least ``process_count`` records: records ``h::process_count`` of all files
      (every host reads every file; shares stay disjoint and cover everything);
    * else (fewer records than hosts) with ``repeat``: records ``h::process_count`` of the
      repeated stream, so every host gets records (some records then reach several hosts);
      without ``repeat`` (eval) some shares are empty and the caller pads.
    """
    import tensorflow as tf

    if file_level_sharding(files, process_count):
        records = tf.data.TFRecordDataset(files[process_index::process_count])
        return records.repeat() if repeat else records
    records = tf.data.TFRecordDataset(files)
    if repeat and sum(1 for _ in records.take(process_count)) < process_count:
        return records.repeat().shard(process_count, process_index)
    records = records.shard(process_count, process_index)
    return records.repeat() if repeat else records


def _pad_rows(batch, valid):
    """Zeroes the padding rows of a finite split's last batch."""
    import tensorflow as tf

    out = {}
    for name, value in batch.items():
        if not value.shape.rank:  # host_seconds: the batch's, not a row's
            out[name] = value
            continue
        shape = [-1] + [1] * (len(value.shape) - 1)
        out[name] = value * tf.cast(tf.reshape(valid, shape), value.dtype)
    return out


def tfrecord_dataset(
    data_config, *, batch_size, seed, process_index, process_count, split, start_batch
):
    """Per-host batches from TFRecords (see ``bertjax.data.pipeline``'s docstring)."""
    import tensorflow as tf

    files, pack_size = record_layout(data_config, split)
    parse = parser(data_config, pack_size)
    if split == "train":
        with _naming_files(data_config, split):  # host_records may count the records
            records = host_records(files, process_index, process_count, repeat=True)
        records = records.shuffle(data_config.shuffle_buffer, seed=seed)
        batches = records.batch(batch_size, drop_remainder=True).skip(start_batch)
        return batches.map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    # Eval: every host counts every host's share so that all yield the same number of batches.
    shares = [host_records(files, h, process_count, repeat=False) for h in range(process_count)]
    with _naming_files(data_config, split):
        num_batches = max(1, -(-max(sum(1 for _ in share) for share in shares) // batch_size))
    records = shares[process_index]
    # Pad rows reuse a real record's bytes (an empty Example fails FixedLenFeature) with weight 0.
    filler = tf.constant(_first_record(files)[1])
    pad = tf.data.Dataset.from_tensors(filler).repeat().map(lambda r: (r, False))
    padded = records.map(lambda r: (r, True)).concatenate(pad)
    padded = padded.take(num_batches * batch_size).batch(batch_size).skip(start_batch)
    return padded.map(lambda r, valid: _pad_rows(parse(r), valid)).prefetch(tf.data.AUTOTUNE)
