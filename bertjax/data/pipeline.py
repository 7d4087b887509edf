"""Per-host pretraining batches in ``tf.data`` (no JAX). This docstring is the batch contract.

Every element is a dict of numpy-convertible tensors with static shapes, ``B`` = per-host batch
(global batch / process_count), ``L`` = ``data.max_seq_length``, ``P`` =
``data.max_predictions_per_seq``; feature names are the original BERT ones, so TFRecords made by
Google's ``create_pretraining_data.py`` (or ours) load unchanged:

* ``input_ids <int32>[B, L]``: ``[CLS] A [SEP] B [SEP]`` then ``[PAD]``, after masking.
* ``segment_ids <int32>[B, L]``: 0 for ``[CLS] A [SEP]`` (and padding), 1 for ``B [SEP]``.
* ``input_mask <int32>[B, L]``: 1 on real tokens, 0 on padding.
* ``masked_lm_positions <int32>[B, P]``: predicted positions in increasing order, then 0.
* ``masked_lm_ids <int32>[B, P]``: the original tokens at those positions, then 0.
* ``masked_lm_weights <float32>[B, P]``: 1.0 for real predictions, 0.0 for list padding.
* ``next_sentence_labels <int32>[B]``: 0 = B is the actual next segment (IsNext), 1 = random
  (NotNext), the original convention; always 0 when ``data.nsp`` is False (label unused).
* ``example_weight <float32>[B]``: 1.0 for real rows; 0.0 for the padding rows that make every
  host's finite eval stream the same length (their ``masked_lm_weights`` are all zero too).
* ``host_seconds <float32>[]``: the host work that made this batch, in seconds: the CPU time of
  the thread that tokenized rows into features and masked them (text/tfds), or the time spent
  parsing the records (TFRecords). Not a model input: the train loop takes it out and reports
  the pipeline's own throughput from it (``bertjax.training.loop``, ``host_rate``).

**The packed row** (``data.pack_sequences``; sequence packing without cross-contamination,
Krell et al. 2021; built by ``bertjax.data.packing.pack_features``, the one builder of
pretraining, fine-tuning and feature extraction; made online by ``pack_table`` below, or read
from TFRecords written by ``create_pretraining_data --pack_sequences``): a row holds up to
``K`` = ``data.max_sequences_per_pack`` whole instances one after another, then padding. The
features above keep their meaning over the row: ``input_ids``, ``segment_ids`` (each instance's
token types), ``input_mask`` (1 on every instance's tokens); ``masked_lm_*`` hold all instances'
predictions as row positions, increasing, then 0, in the same ``P`` (the packer never puts more
than ``P`` predictions in a row). It adds, with the same names in every packed row:

* ``positions <int32>[B, L]``: position ids, restarting at 0 for each instance (0 on padding).
* ``sequence_ids <int32>[B, L]``: 1..k for the row's k instances in order, 0 on padding.
* ``cls_positions <int32>[B, K]``: each instance's first token ([CLS]) row position, then 0.
* ``instance_weights <float32>[B, K]``: 1.0 for real instances, 0.0 for empty slots.
* per-instance labels ``[B, K]``, then 0: here ``next_sentence_labels <int32>[B, K]`` (the
  convention above); a fine-tuning task's ``label_ids`` (``bertjax.finetune.packed``; a
  tagger's labels are per token, ``[B, L]``).

Each instance attends only to itself (``bertjax.model.attention``), reads its own position
embeddings, pools its own [CLS] for NSP, and predicts only its own masked tokens, so a packed
row computes exactly what its instances would alone. A row without ``sequence_ids`` (every
record made by Google's script, or ours without packing) is one instance: ``sequence_ids`` =
``input_mask``, ``positions`` = 0..L-1, ``cls_positions`` = [0], weights [1]
(``bertjax.pretrain.objective`` reads both forms).

With ``data.objective == "ltr"`` (left-to-right ablation) inputs are not masked and
``P == L``: position ``i`` predicts token ``i + 1`` (weight 1 where that token is real).

Sources (``data.source``): ``"text"`` files / ``"tfds"`` documents are tokenized **once** into an
instance table (unmasked A/B rows, see ``bertjax.data.sources``) cached under ``data.cache_dir``,
identical on every host; ``"tfrecord"`` reads pre-masked TFRecords.

Determinism and resume (text/tfds): the stream (every feature but ``host_seconds``, a timing) is
a pure function of ``(seed, position)``.
Global batch ``k`` holds stream positions ``k*G .. k*G+G-1`` (``G`` = global batch); host ``h``
takes ``B`` of them starting at ``k*G + h*B``, so hosts get disjoint rows and together the
whole table every epoch, whatever the host count. Position ``p`` is row
``permutation_e(p mod N)`` of epoch ``e = p // N`` (a seeded Feistel bijection, O(1) memory,
random access), masked with randomness keyed by ``p`` (dynamic: fresh masks every epoch) or by
the row (static: ``dupe_factor`` pairings each with one fixed mask, like the original). The A/B
pairings themselves are made once per table (``dupe_factor`` of them per document), in both modes.
Resuming at ``start_batch`` therefore starts the range at ``start_batch`` and reads only the rows
it needs: nothing before it is re-read or re-tokenized (the table is reused from the cache, or
rebuilt identically if the cache is gone). The train stream is infinite; eval is finite, in
row order, with static masks, padded to the same number of batches on every host.

Packed (``data.pack_sequences``, text/tfds): the table's instances are packed once per
pipeline (``pack_table``: the table permuted with the seed, then windows of ``PACK_WINDOW``
instances, so a row's instances come from anywhere in the table; the same on every host), and
the stream's units are those packed rows instead of table rows: position ``p`` is packed row
``permutation_e(p mod R)``, its instance in slot ``j`` masked with the key ``p * K + j``
(dynamic) or its table row (static). Instances, pairings and masks are made as unpacked; only
their arrangement differs.

Cost: every host tokenizes the whole text corpus once (first call; later calls and restarts
reuse the cache), which suits corpora up to a few GB; for Wikipedia-scale data on many hosts,
run ``bertjax.create_pretraining_data`` once and train from the sharded TFRecords.

TFRecords: host ``h`` reads files ``h::process_count`` when every such share holds a non-empty
file, else records ``h::process_count`` of all files (fewer files than hosts, or empty files),
so shares are disjoint and cover every record whatever the file sizes
(``tfrecords.host_records``); train repeats its share forever (uneven shares never stop a host
early; with fewer records than hosts the repeated stream is dealt out instead), shuffles with a
seeded buffer, and skips ``start_batch`` batches before parsing (reads, never tokenizes); eval
pads every host to the longest share.
"""

from __future__ import annotations

import functools
import math
import time

import numpy as np

from bertjax.data import instances, masking, packing, sources, tfrecords
from bertjax.data.instances import DataError

FEATURES = (
    "input_ids",
    "segment_ids",
    "input_mask",
    "masked_lm_positions",
    "masked_lm_ids",
    "masked_lm_weights",
    "next_sentence_labels",
    "example_weight",
)
# What the train step reads; ``example_weight`` (0 for eval padding rows) is eval-only.
STEP_FEATURES = tuple(name for name in FEATURES if name != "example_weight")
# What a packed row adds (the docstring's packed row; next_sentence_labels is then [B, K]).
PACKED_FEATURES = packing.ROW_FEATURES
HOST_SECONDS = "host_seconds"  # the batch's host work (module docstring); not a model input


def num_predictions(data_config) -> int:
    """``P``: ``max_predictions_per_seq`` (== ``max_seq_length`` for the LTR objective)."""
    return int(data_config.max_predictions_per_seq)


def check_data_config(data_config, model_config=None) -> None:
    """Raises DataError naming the field when ``config.data`` (and the model) cannot work."""
    d = data_config
    if d.source not in ("text", "tfds", "tfrecord"):
        raise DataError(f"data.source={d.source!r}: expected 'text', 'tfds' or 'tfrecord'")
    if d.objective not in ("mlm", "ltr"):
        raise DataError(f"data.objective={d.objective!r}: expected 'mlm' or 'ltr'")
    if d.masking not in ("dynamic", "static"):
        raise DataError(f"data.masking={d.masking!r}: expected 'dynamic' or 'static'")
    if d.max_seq_length < 5:
        raise DataError(f"data.max_seq_length={d.max_seq_length}: need at least 5")
    if d.max_predictions_per_seq < 1:
        raise DataError(f"data.max_predictions_per_seq={d.max_predictions_per_seq}: need >= 1")
    if not 0.0 < d.masked_lm_prob < 1.0:
        raise DataError(f"data.masked_lm_prob={d.masked_lm_prob}: expected in (0, 1)")
    if not 0.0 <= d.short_seq_prob <= 1.0:
        raise DataError(f"data.short_seq_prob={d.short_seq_prob}: expected in [0, 1]")
    if d.dupe_factor < 1:
        raise DataError(f"data.dupe_factor={d.dupe_factor}: need >= 1")
    if not isinstance(d.pack_sequences, bool):
        raise DataError(f"data.pack_sequences={d.pack_sequences!r}: expected True or False")
    if d.max_sequences_per_pack < 1:
        raise DataError(f"data.max_sequences_per_pack={d.max_sequences_per_pack}: need >= 1")
    if d.objective == "ltr":
        if d.nsp:
            raise DataError("data.objective='ltr' needs data.nsp=False (the paper's LTR & No NSP)")
        if d.max_predictions_per_seq != d.max_seq_length:
            raise DataError(
                f"data.objective='ltr' predicts every position: set data.max_predictions_per_seq"
                f" = data.max_seq_length = {d.max_seq_length} (got {d.max_predictions_per_seq})"
            )
    if d.source != "tfds":
        sources.resolve_files(d.input_files, "input_files")
        if d.eval_input_files:  # may stay empty when train.eval_every == 0
            sources.file_patterns(d.eval_input_files, "eval_input_files")
    if d.source == "tfrecord":
        _check_record_packing(d, *tfrecords.record_layout(d, split="train"))
    if model_config is not None:
        if d.max_seq_length > model_config.max_position_embeddings:
            raise DataError(
                f"data.max_seq_length={d.max_seq_length} exceeds "
                f"model.max_position_embeddings={model_config.max_position_embeddings}"
            )
        if d.source != "tfrecord":
            tokenizer = sources.create_tokenizer(d)
            if tokenizer.vocab_size != model_config.vocab_size:
                raise DataError(
                    f"model.vocab_size={model_config.vocab_size} but data.vocab_file "
                    f"{d.vocab_file} has {tokenizer.vocab_size} entries"
                )


def _check_record_packing(d, files: list[str], pack_size: int | None) -> None:
    """DataError unless ``data.pack_sequences``/``max_sequences_per_pack`` say what the records
    are (packing is detected from the first record: ``tfrecords.record_layout``)."""
    if pack_size is None and d.pack_sequences:
        raise DataError(
            f"data.pack_sequences=True but {files[0]} holds unpacked records; set it False or"
            " write packed ones (create_pretraining_data --pack_sequences)"
        )
    if pack_size is not None and (not d.pack_sequences or pack_size != d.max_sequences_per_pack):
        raise DataError(
            f"{files[0]} holds packed records of up to {pack_size} instances: set"
            f" data.pack_sequences=True and data.max_sequences_per_pack={pack_size}"
        )


def masking_spec(data_config, tokenizer) -> masking.MaskingSpec:
    """The masking rule for ``tokenizer``'s vocab and ``config.data``."""
    table = None
    if data_config.do_whole_word_mask:
        table = masking.continuation_table(tokenizer.vocab, data_config.tokenizer)
    return masking.MaskingSpec(
        vocab_size=tokenizer.vocab_size,
        mask_id=tokenizer.mask_id,
        special_ids=tuple(sorted(tokenizer.special_ids)),
        max_predictions_per_seq=num_predictions(data_config),
        masked_lm_prob=float(data_config.masked_lm_prob),
        do_whole_word_mask=bool(data_config.do_whole_word_mask),
        is_continuation=table,
    )


def rows_to_features(rows: np.ndarray, row_keys: np.ndarray, data_config, spec):
    """Instance rows ``<int32>[R, L + 4]`` -> the batch dict (without ``example_weight``)."""
    length = data_config.max_seq_length
    ids, meta = rows[:, :length], rows[:, length:]
    positions = np.arange(length)[None, :]
    input_mask = (positions < meta[:, [instances.META_NUM_TOKENS]]).astype(np.int32)
    segment_ids = (positions >= meta[:, [instances.META_B_START]]) & (input_mask > 0)
    if data_config.objective == "ltr":
        features = masking.ltr_targets(ids, input_mask)
    else:
        features = masking.mask_batch(ids, input_mask, row_keys, spec)
    features["input_mask"] = input_mask
    features["segment_ids"] = segment_ids.astype(np.int32)
    features["next_sentence_labels"] = meta[:, instances.META_LABEL].astype(np.int32)
    return features


def feistel_permutation(index: np.ndarray, size: int, key: int) -> np.ndarray:
    """A seeded bijection of ``[0, size)``: ``<int64>[m]`` -> ``<int64>[m]`` (cycle-walking
    4-round Feistel network on the next even power of two)."""
    half = max(1, math.ceil(math.log2(max(size, 2)) / 2))
    mask = np.uint64((1 << half) - 1)
    x = index.astype(np.uint64)
    todo = np.ones(x.shape, dtype=bool)
    while np.any(todo):
        left, right = x[todo] >> np.uint64(half), x[todo] & mask
        for round_ in range(4):
            left, right = right, left ^ (masking.hash_keys(key, round_, right) & mask)
        x[todo] = (left << np.uint64(half)) | right
        todo = x >= np.uint64(size)
    return x.astype(np.int64)


_PERMUTE_BATCHES = 16
PACK_WINDOW = 10_000  # instances the online pipeline packs together (``pack_table``)
_PACK_ORDER_STREAM = 0x7061636B  # keys pack_order's permutation apart from the epochs' ("pack")
COUNTED_RECORDS = 10_000  # packed TFRecords counted for ``instances_per_row``


def pack_table(table, data_config, spec, seed: int) -> np.ndarray:
    """The online pipeline's packed rows: ``<int64>[R, K]`` instance-table rows per packed row,
    -1 after its last instance. The table's rows are permuted with the run's ``seed`` first
    (``pack_order``), then ``bertjax.data.packing`` packs consecutive windows of
    ``PACK_WINDOW`` of them (the bound on one packing's work), each instance counted with the
    most predictions masking can give it: a pure function of the table, ``data`` and ``seed``,
    the same on every host."""
    length, k = int(data_config.max_seq_length), int(data_config.max_sequences_per_pack)
    lengths = table.num_tokens()
    if data_config.objective == "ltr":
        predictions = lengths - 1  # each real token but the last predicts the next
    else:
        predictions = masking.max_predictions(lengths, spec)
    preds = num_predictions(data_config)
    order = pack_order(len(lengths), seed)
    out = []
    for start in range(0, len(lengths), PACK_WINDOW):
        window = order[start : start + PACK_WINDOW]
        for row in packing.pack(lengths[window], predictions[window], length, k, preds):
            out.append([*window[row].tolist(), *[-1] * (k - len(row))])
    return np.asarray(out, np.int64).reshape(-1, k)


def pack_order(num_rows: int, seed: int) -> np.ndarray:
    """``<int64>[num_rows]``: the order ``pack_table`` packs the table's rows in, a seeded
    permutation (``feistel_permutation``, keyed apart from the epochs' permutations). The table
    is document-major, every dupe of a document together: in table order a window would give a
    row instances of a few hundred neighbouring documents, dupes included, where the unpacked
    stream draws its rows from the whole table."""
    key = int(masking.hash_keys(seed, _PACK_ORDER_STREAM, 0))
    return feistel_permutation(np.arange(num_rows, dtype=np.int64), num_rows, key)


def instances_per_row(data_config, seed: int) -> float:
    """The train data's mean instances per row: 1 unpacked; packed, those of the online
    pipeline's packed rows (exact), or of the first ``COUNTED_RECORDS`` packed records."""
    if not data_config.pack_sequences:
        return 1.0
    return row_figures(data_config, seed)["instances_per_row"]


def row_figures(data_config, seed: int) -> dict[str, float]:
    """The train rows' ``instances_per_row`` and ``fill`` (real tokens / token slots, 1 - the
    padding share): of every row the online pipeline makes (exact), or of the first
    ``COUNTED_RECORDS`` TFRecords. What ``bertjax.compile`` turns a step's slots into real
    tokens with."""
    length = int(data_config.max_seq_length)
    if data_config.source == "tfrecord":
        import tensorflow as tf  # noqa: PLC0415

        files, pack_size = tfrecords.record_layout(data_config, split="train")
        parse = tfrecords.parser(data_config, pack_size)
        records = tf.data.TFRecordDataset(files).take(COUNTED_RECORDS).batch(1024).map(parse)
        batches = list(records.as_numpy_iterator())
        tokens = sum(int(b["input_mask"].sum()) for b in batches)
        rows = sum(len(b["input_mask"]) for b in batches)
        instances = sum(float(b["instance_weights"].sum()) for b in batches) if pack_size else rows
        return {
            "instances_per_row": instances / max(rows, 1),
            "fill": tokens / max(rows * length, 1),
        }
    tokenizer = sources.create_tokenizer(data_config)
    table = sources.open_or_build(data_config, tokenizer, "train", seed)
    tokens = int(table.num_tokens().sum())
    rows = table.num_rows
    if data_config.pack_sequences:
        rows = len(pack_table(table, data_config, masking_spec(data_config, tokenizer), seed))
    return {
        "instances_per_row": table.num_rows / max(rows, 1),
        "fill": tokens / max(rows * length, 1),
    }


def _batch_fn(
    table, data_config, spec, *, batch_size, seed, process_index, process_count, train, packs
):
    """-> ``f(k) -> dict``: host ``process_index``'s share of global batch ``k`` (numpy). The
    stream's units are the table's rows, or with ``packs`` (``pack_table``) its packed rows."""
    size = table.num_rows if packs is None else len(packs)
    static = data_config.masking == "static"

    def positions_of(k):
        return (int(k) * process_count + process_index) * batch_size + np.arange(batch_size)

    @functools.lru_cache(maxsize=4)  # tf.data calls make() from a few threads, roughly in order
    def permuted_rows(group):
        """Rows of this host's batches ``group*G .. group*G+G-1`` (G = _PERMUTE_BATCHES): the
        Feistel network runs once per G batches, as its per-call cost is mostly overhead."""
        first = group * _PERMUTE_BATCHES
        positions = np.concatenate(
            [positions_of(k) for k in range(first, first + _PERMUTE_BATCHES)]
        )
        epochs = positions // size
        rows = np.empty(len(positions), dtype=np.int64)
        for epoch in np.unique(epochs):  # batches may straddle two epochs
            sel = epochs == epoch
            rows[sel] = feistel_permutation(
                positions[sel] % size, size, int(masking.hash_keys(seed, epoch))
            )
        return rows

    def make(k):
        began = time.thread_time()  # this thread's CPU time: GIL waits and other threads aside
        positions = positions_of(k)
        valid = np.ones(batch_size, dtype=bool)
        if train:
            offset = (int(k) % _PERMUTE_BATCHES) * batch_size
            rows = permuted_rows(int(k) // _PERMUTE_BATCHES)[offset : offset + batch_size]
        else:
            valid = positions < size
            rows = np.where(valid, positions, 0)
        if packs is None:
            keys = masking.hash_keys(seed, rows if static or not train else positions)
            features = rows_to_features(table.read(rows), keys, data_config, spec)
        else:  # rows are packed rows: mask their instances, then pack them (the contract)
            members = packs[rows]  # [B, K]
            real = members >= 0
            slots = positions[:, None] * packs.shape[1] + np.arange(packs.shape[1])
            instance_rows = members[real]
            keys = masking.hash_keys(seed, instance_rows if static or not train else slots[real])
            unpacked = rows_to_features(table.read(instance_rows), keys, data_config, spec)
            first = np.concatenate([[0], np.cumsum(real.sum(axis=1))])
            groups = [list(range(first[b], first[b + 1])) for b in range(batch_size)]
            features = packing.pack_features(unpacked, groups, packs.shape[1])
            features["instance_weights"] *= valid[:, None]
        features["masked_lm_weights"] *= valid[:, None]
        features["example_weight"] = valid.astype(np.float32)
        features[HOST_SECONDS] = np.float32(time.thread_time() - began)
        return tuple(features[name] for name in output_names(data_config))

    return make


def output_names(data_config) -> tuple[str, ...]:
    """The online pipeline's batch features, in order: ``FEATURES`` (+ ``PACKED_FEATURES`` when
    ``data.pack_sequences``) and ``HOST_SECONDS``."""
    packed = PACKED_FEATURES if data_config.pack_sequences else ()
    return (*FEATURES, *packed, HOST_SECONDS)


def _output_signature(batch_size, data_config):
    import tensorflow as tf

    length, preds = data_config.max_seq_length, num_predictions(data_config)
    k = int(data_config.max_sequences_per_pack)
    shapes = {
        "input_ids": [batch_size, length],
        "segment_ids": [batch_size, length],
        "input_mask": [batch_size, length],
        "masked_lm_positions": [batch_size, preds],
        "masked_lm_ids": [batch_size, preds],
        "masked_lm_weights": [batch_size, preds],
        "next_sentence_labels": [batch_size],
        "example_weight": [batch_size],
        HOST_SECONDS: [],
    }
    if data_config.pack_sequences:
        shapes.update(
            positions=[batch_size, length],
            sequence_ids=[batch_size, length],
            cls_positions=[batch_size, k],
            next_sentence_labels=[batch_size, k],
            instance_weights=[batch_size, k],
        )
    dtypes = {name: tf.int32 for name in shapes}
    for name in ("masked_lm_weights", "example_weight", "instance_weights", HOST_SECONDS):
        dtypes[name] = tf.float32
    return shapes, dtypes


def num_eval_batches(num_rows: int, batch_size: int, process_count: int) -> int:
    """Batches per host for a finite split of ``num_rows`` rows (the last ones padded)."""
    return max(1, math.ceil(num_rows / (batch_size * process_count)))


def numpy_batches(dataset, data_config, split: str = "train"):
    """``dataset.as_numpy_iterator()`` for a dataset of ``create_pretrain_dataset``; a TFRecord
    that cannot be read or parsed is a DataError naming the files (``tfrecords``)."""
    batches = dataset.as_numpy_iterator()
    if data_config.source != "tfrecord":
        return batches
    return tfrecords.named_read_errors(batches, data_config, split)


def create_pretrain_dataset(
    data_config,
    *,
    batch_size: int,
    seed: int,
    process_index: int,
    process_count: int,
    split: str = "train",
    start_batch: int = 0,
):
    """This host's batches (see the module docstring): infinite for ``"train"``, finite for
    ``"eval"``; ``start_batch`` = batches this host already consumed."""
    import tensorflow as tf

    check_data_config(data_config)
    if split not in ("train", "eval"):
        raise DataError(f"split={split!r}: expected 'train' or 'eval'")
    if not 0 <= process_index < process_count:
        raise DataError(f"process_index={process_index} not in [0, {process_count})")
    if data_config.source == "tfrecord":
        return tfrecords.tfrecord_dataset(
            data_config,
            batch_size=batch_size,
            seed=seed,
            process_index=process_index,
            process_count=process_count,
            split=split,
            start_batch=start_batch,
        )
    tokenizer = sources.create_tokenizer(data_config)
    table = sources.open_or_build(data_config, tokenizer, split, seed)
    spec = masking_spec(data_config, tokenizer)
    packs = pack_table(table, data_config, spec, seed) if data_config.pack_sequences else None
    make = _batch_fn(
        table,
        data_config,
        spec,
        batch_size=batch_size,
        seed=seed,
        process_index=process_index,
        process_count=process_count,
        train=split == "train",
        packs=packs,
    )
    stop = np.iinfo(np.int64).max
    if split == "eval":
        units = table.num_rows if packs is None else len(packs)
        stop = num_eval_batches(units, batch_size, process_count)
    shapes, dtypes = _output_signature(batch_size, data_config)
    names = output_names(data_config)

    def to_batch(k):
        outputs = tf.numpy_function(make, [k], [dtypes[name] for name in names], stateful=False)
        pairs = zip(names, outputs, strict=True)
        return {name: tf.ensure_shape(t, shapes[name]) for name, t in pairs}

    dataset = tf.data.Dataset.range(start_batch, stop)
    dataset = dataset.map(to_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return dataset.prefetch(tf.data.AUTOTUNE)
