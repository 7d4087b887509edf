"""Offline pretraining data: text corpus -> masked MLM+NSP TFRecords (the original's format).

The command is ``python -m bertjax.create_pretraining_data``
(``bertjax/create_pretraining_data.py``, the original script's flags). Records parse with the
original ``run_pretraining.py`` spec (``bertjax.data.tfrecords``).

Unlike the original it streams with bounded memory and uses every core. Spawned worker processes
(TensorFlow in each) cut the corpus at document starts into work units of ``--work_unit_bytes``
of text and at least 2 documents (``bertjax.data.work_units``: each worker cuts a span of the
corpus, so no process reads it all; a ``.gz`` input is decompressed once, by the worker that cuts
it, which writes each of its units' text to the scratch directory as a plain piece), then
tokenize, pair, shuffle (a bounded buffer of ``--shuffle_buffer`` instances), mask and serialize
one unit at a time into scratch files, which this process appends to the output shards in unit
order. Record ``j`` of unit ``u`` goes to shard ``(u + j) % num_shards``, so every shard holds a
slice of every unit. All randomness is keyed by ``(--random_seed, unit)``: the output is a pure
function of the flags and the corpus, identical for any ``--num_workers``.
NotNext segments are drawn from up to ``--random_doc_pool`` documents around the current one
*within its unit* (the original: anywhere in the corpus held in RAM). Masks are static (one per
instance; each of ``dupe_factor`` copies has its own pairing and mask). With ``--pack_sequences``
(``bertjax.data.packing``) each unit's masked instances, exactly the records the unpacked output
would hold, are packed **per work unit** at its end: the unit is the packing window (a worker
holds its masked instances, about ``4 * (3 L + 3 P + 1)`` bytes each), and its packed rows take
the records' place (row ``j`` to shard ``(u + j) % num_shards``), so packed output is as
independent of ``--num_workers`` as unpacked output. Shards are written atomically at the end
(``bertjax.atomic``). Prints the ``bertjax.data.stats`` summary when done.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import random
import shutil
import tempfile

import numpy as np

from bertjax import atomic
from bertjax.data import instances, masking, packing, sources, stats, tfrecords, work_units
from bertjax.data.instances import DataError

_BLOCK = 512  # instances masked and serialized together


def output_paths(output_file: str, num_shards: int) -> list[str]:
    paths = [p for p in output_file.split(",") if p]
    if not paths:
        raise DataError("--output_file is empty")
    if num_shards < 1:
        raise DataError(f"--num_output_shards={num_shards}: need >= 1")
    if num_shards > 1:
        if len(paths) > 1:
            raise DataError("use either a comma list in --output_file or --num_output_shards")
        paths = [f"{paths[0]}-{i:05d}-of-{num_shards:05d}" for i in range(num_shards)]
    return paths


def shuffled(blocks, buffer_size: int, rng: random.Random):
    """Streams rows from instance blocks through a bounded random-replacement buffer."""
    buffer = []
    for block in blocks:
        for row in block:
            if len(buffer) < buffer_size:
                buffer.append(row)
                continue
            i = rng.randrange(buffer_size)
            yield buffer[i]
            buffer[i] = row
    rng.shuffle(buffer)
    yield from buffer


def _blocks_of(rows, size: int):
    block = []
    for row in rows:
        block.append(row)
        if len(block) == size:
            yield np.stack(block)
            block = []
    if block:
        yield np.stack(block)


@dataclasses.dataclass(frozen=True)
class Job:
    """What every worker needs besides the unit: settings (picklable for spawned workers)."""

    data_config: dict
    seed: int
    shuffle_buffer: int
    num_shards: int
    scratch_dir: str
    unit_bytes: int


_WORKER: dict = {}  # per process: the job, its tokenizer and masking spec (built once)


def _init_worker(job: Job) -> None:
    import ml_collections

    from bertjax import startup

    startup.import_tensorflow()  # before the data modules import it: without start-up noise
    from bertjax.data import pipeline

    data_config = ml_collections.ConfigDict(job.data_config)
    tokenizer = sources.create_tokenizer(data_config)
    _WORKER.update(
        job=job,
        data_config=data_config,
        tokenizer=tokenizer,
        tokenize=instances.line_batch_tokenizer(tokenizer),
        spec=pipeline.masking_spec(data_config, tokenizer),
        options=sources.instance_options(data_config, tokenizer),
    )


def unit_shard_path(scratch_dir: str, unit: int, shard: int) -> str:
    return os.path.join(scratch_dir, f"unit-{unit:06d}-shard-{shard:05d}.tfrecord")


def unit_shard_pattern(scratch_dir: str, shard: int) -> str:
    """The glob of ``shard``'s scratch files, every unit's (``unit_shard_path``)."""
    return os.path.join(scratch_dir, f"unit-*-shard-{shard:05d}.tfrecord")


def unit_of(scratch_path: str) -> int:
    """The unit number in a ``unit_shard_path``."""
    return int(os.path.basename(scratch_path).split("-")[1])


def cut_span(span: work_units.Span) -> list[work_units.WorkUnit]:
    """``work_units.cut_span`` in a worker: a ``.gz`` file's pieces go to the scratch directory."""
    job = _WORKER["job"]
    return work_units.cut_span(span, job.unit_bytes, split_dir=job.scratch_dir)


def write_unit(unit: work_units.WorkUnit) -> stats.Accumulator:
    """Pairs, shuffles, masks and serializes one unit into per-shard scratch files.

    Everything is keyed by ``(seed, unit.index)``: pairing seed, shuffle order, masks, and the
    shard of the unit's ``j``-th record (``(unit.index + j) % num_shards``), so the output does
    not depend on which worker ran the unit or when.
    """
    import tensorflow as tf

    from bertjax.data import pipeline

    job, data_config, tokenizer = _WORKER["job"], _WORKER["data_config"], _WORKER["tokenizer"]
    length = data_config.max_seq_length
    unit_seed = int(masking.hash_keys(job.seed, unit.index))
    documents = work_units.unit_documents(unit, _WORKER["tokenize"])
    blocks = instances.generate_instances(documents, unit_seed, _WORKER["options"], unit.describe())
    rows = shuffled(blocks, job.shuffle_buffer, random.Random(unit_seed))
    totals = stats.Accumulator(length, tokenizer)
    writers, index, held = {}, 0, []

    def write(features):
        for r, record in enumerate(tfrecords.serialize_rows(features)):
            shard = (unit.index + index + r) % job.num_shards
            if shard not in writers:
                path = unit_shard_path(job.scratch_dir, unit.index, shard)
                writers[shard] = tf.io.TFRecordWriter(path)
            writers[shard].write(record)

    try:
        for block in _blocks_of(rows, _BLOCK):
            keys = masking.hash_keys(unit_seed, index + np.arange(len(block)))
            features = pipeline.rows_to_features(block, keys, data_config, _WORKER["spec"])
            if data_config.pack_sequences:  # the unit's masked instances, packed at its end
                held.append((features, block[:, length + 3]))
            else:
                totals.add(features, original_ids=block[:, :length], truncated=block[:, length + 3])
                write(features)
            index += len(block)
        if held:
            index = 0  # packed rows are numbered afresh for their shards
            packed, truncated_per_row, ideal_rows = _pack_unit(held, data_config)
            totals.add(packed, truncated=truncated_per_row)
            totals.counts["ideal_rows"] += ideal_rows
            write(packed)
    finally:
        for writer in writers.values():
            writer.close()
    return totals


def _pack_unit(held, data_config) -> tuple[dict, np.ndarray, int]:
    """A unit's masked instances (blocks of features with their truncation flags) -> its packed
    rows (``bertjax.data.packing``), each row's count of truncated instances, and the fewest
    rows any packing could use."""
    features = {name: np.concatenate([f[name] for f, _ in held]) for name in held[0][0]}
    truncated = np.concatenate([t for _, t in held])
    lengths = features["input_mask"].sum(axis=1)
    predictions = (features["masked_lm_weights"] > 0).sum(axis=1)
    bounds = (
        data_config.max_seq_length,
        data_config.max_sequences_per_pack,
        data_config.max_predictions_per_seq,
    )
    rows = packing.pack(lengths, predictions, *bounds)
    packed = packing.pack_features(features, rows, data_config.max_sequences_per_pack)
    truncated_per_row = np.array([int(truncated[row].sum()) for row in rows])
    return packed, truncated_per_row, packing.minimum_rows(lengths, predictions, *bounds)


@contextlib.contextmanager
def _workers(job: Job, num_workers: int):
    """Yields ``run(function, items) -> results in item order``: here (1 worker) or in
    ``num_workers`` spawned processes (TensorFlow in each; ``imap`` keeps the order)."""
    if num_workers <= 1:
        _init_worker(job)
        yield map
        return
    context = multiprocessing.get_context("spawn")  # fork after TensorFlow's threads is unsafe
    with context.Pool(num_workers, _init_worker, (job,)) as pool:
        yield pool.imap


def default_workers(num_units: int, cores: int | None = None) -> int:
    """``--num_workers=0``: every core, but no more workers than units (each costs a TensorFlow
    start-up; the units are estimated before the cut, ``work_units.estimated_units``). Measured
    (docs/benchmarks.md, "Offline TFRecords"): on an idle 2-core machine two workers finished
    sooner than one from 4 MB (4 units) up, now that this process does not import TensorFlow
    beside them."""
    cores = cores or os.cpu_count() or 1
    return max(1, min(cores, num_units))


def _append(source: str, destination) -> None:
    """Appends a scratch TFRecord file to ``destination`` and removes it (TFRecord files are
    self-delimiting records, so concatenated files are one valid file)."""
    if os.path.exists(source):
        with open(source, "rb") as f:
            shutil.copyfileobj(f, destination, 1 << 22)
        os.remove(source)


def write_tfrecords(
    data_config,
    paths: list[str],
    seed: int,
    shuffle_buffer: int,
    num_workers: int = 1,
    unit_bytes: int = 1 << 20,
) -> dict:
    """Tokenizes, pairs, masks and writes ``paths``; returns the statistics of what was written.

    ``num_workers`` processes (0: ``default_workers``) cut the corpus's spans into work units
    (``bertjax.data.work_units``) and turn the units into scratch shards; this process appends
    them to the outputs in unit order (and deletes them), so the output is the same for any
    ``num_workers``. With local paths this process never imports TensorFlow (seconds of CPU that
    the workers need) and never reads the corpus.
    """
    scratch = tempfile.mkdtemp(prefix="bertjax-pretraining-data-")
    job = Job(data_config.to_dict(), seed, shuffle_buffer, len(paths), scratch, unit_bytes)
    total = None
    try:
        files = sources.resolve_files(data_config.input_files, "input_files")
        spans = work_units.spans(files, unit_bytes)
        workers = num_workers or default_workers(work_units.estimated_units(spans, unit_bytes))
        with _workers(job, workers) as run, contextlib.ExitStack() as out:
            units = work_units.stitch(run(cut_span, spans))
            if not units:
                raise DataError(f"data.input_files {files}: no documents (empty input)")
            # Each shard lands atomically when every unit is in (bertjax.atomic); after a
            # failure no half-written shard is left behind.
            outputs = [out.enter_context(atomic.writer(p, "wb")) for p in paths]
            for unit, stats in zip(units, run(write_unit, units), strict=True):
                for shard, output in enumerate(outputs):
                    _append(unit_shard_path(scratch, unit.index, shard), output)
                total = stats if total is None else total.merge(stats)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return total.summary()
