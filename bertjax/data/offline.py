"""Offline pretraining data: text corpus -> masked MLM+NSP TFRecords (the original's format).

The command is ``python -m bertjax.create_pretraining_data``
(``bertjax/create_pretraining_data.py``, the original script's flags). Records parse with the
original ``run_pretraining.py`` spec (``bertjax.data.tfrecords``).

Unlike the original it streams with bounded memory and uses every core. Spawned worker processes
(TensorFlow in each) cut the corpus at document starts into work units of ``--work_unit_bytes``
of text and at least 2 documents (``bertjax.data.work_units``: each worker cuts a span of the
corpus, so no process reads it all; a ``.gz`` input is decompressed once, by the worker that cuts
it, which writes each of its units' text to the scratch directory as a plain piece), then
read, tokenize, pair, shuffle (a bounded buffer of ``--shuffle_buffer`` instances), mask and
serialize one unit at a time into its shard pieces, which this process appends to the output
shards in unit order. Record ``j`` of unit ``u`` goes to shard ``(u + j) % num_shards``, so every
shard holds a slice of every unit. All randomness is keyed by ``(--random_seed, unit)``: the
output is a pure function of the flags and the corpus, identical for any ``--num_workers``.
NotNext segments are drawn from up to ``--random_doc_pool`` documents around the current one
*within its unit* (the original: anywhere in the corpus held in RAM). Masks are static (one per
instance; each of ``dupe_factor`` copies has its own pairing and mask). With ``--pack_sequences``
(``bertjax.data.packing``) a unit's masked instances, exactly the records the unpacked output
would hold, are packed in windows of ``pipeline.PACK_WINDOW`` consecutive instances (the online
pipeline's window) in the unit's shuffled order, and the packed rows take the records' place
(row ``j`` of the unit to shard ``(u + j) % num_shards``), so packed output is as independent of
``--num_workers`` as unpacked output.

**Memory** does not grow with the unit: a worker holds a few MiB of its unit's text at a time
(``work_units.unit_lines``), ``--random_doc_pool`` tokenized documents, the ``--shuffle_buffer``
rows (``4 (L + 4)`` bytes each), one masked block and, packing, one window of masked instances
(about ``4 (3 L + 3 P + 1)`` bytes each) and its packed rows: measured flat from 16 to 256 MiB
units (``bench/create_data_memory_bench.py``; docs/benchmarks.md, "Memory per worker").

**Nothing goes missing silently** (``bertjax.data.shard_pieces``): a unit's attempt writes its
pieces under names of its own and lands them only when the whole unit succeeded, and returns
what each holds (records, bytes); this process reads exactly the pieces of the results it got,
checks each one (present, its size, its TFRecords) before appending it, and fails with one line
naming the first missing or short piece. The shards are written atomically at the end
(``bertjax.atomic``): after any failure no output shard is left. Prints the
``bertjax.data.stats`` summary when done.
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
from bertjax.data import (
    instances,
    masking,
    packing,
    shard_pieces,
    sources,
    stats,
    tfrecords,
    work_units,
)
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
    """Streams rows from instance blocks through a bounded random-replacement buffer.

    The buffer is one ``[buffer_size, width]`` array that rows are copied into: holding the rows
    themselves (views) would keep every block alive while any of its rows waits, several times
    the buffer."""
    buffer, filled = None, 0
    for block in blocks:
        if buffer is None:
            buffer = np.empty((buffer_size, block.shape[1]), block.dtype)
        for row in block:
            if filled < buffer_size:
                buffer[filled] = row
                filled += 1
                continue
            i = rng.randrange(buffer_size)
            out = buffer[i].copy()
            buffer[i] = row
            yield out
    order = list(range(filled))
    rng.shuffle(order)  # the permutation random.shuffle would give the rows themselves
    for i in order:
        yield buffer[i]


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


def cut_span(span: work_units.Span) -> list[work_units.WorkUnit]:
    """``work_units.cut_span`` in a worker: a ``.gz`` file's pieces go to the scratch directory."""
    job = _WORKER["job"]
    return work_units.cut_span(span, job.unit_bytes, split_dir=job.scratch_dir)


def write_unit(
    unit: work_units.WorkUnit,
) -> tuple[stats.Accumulator, shard_pieces.UnitPieces]:
    """Pairs, shuffles, masks (and packs) one unit into its shard pieces
    (``bertjax.data.shard_pieces``: they land only if the whole unit succeeds) -> the statistics
    of its records and what its pieces hold.

    Everything is keyed by ``(seed, unit.index)``: pairing seed, shuffle order, masks, and the
    shard of the unit's ``j``-th record (``(unit.index + j) % num_shards``), so the output does
    not depend on which worker ran the unit or when.
    """
    job, tokenizer = _WORKER["job"], _WORKER["tokenizer"]
    unit_seed = int(masking.hash_keys(job.seed, unit.index))
    documents = work_units.unit_documents(unit, _WORKER["tokenize"])
    blocks = instances.generate_instances(documents, unit_seed, _WORKER["options"], unit.describe())
    rows = shuffled(blocks, job.shuffle_buffer, random.Random(unit_seed))
    totals = stats.Accumulator(_WORKER["data_config"].max_seq_length, tokenizer)
    with shard_pieces.Attempt(job.scratch_dir, unit.index) as attempt:
        index = 0  # records so far
        for features in _records(_masked(rows, unit_seed), totals):
            for record in tfrecords.serialize_rows(features):
                attempt.write((unit.index + index) % job.num_shards, record)
                index += 1
        return totals, attempt.commit()


def _masked(rows, unit_seed: int):
    """Shuffled instance rows -> masked blocks ``(features, original ids <int32>[n, L],
    truncated <int32>[n])``, instance ``i`` of the unit masked with the key ``(unit_seed, i)``."""
    from bertjax.data import pipeline

    data_config, index = _WORKER["data_config"], 0
    length = data_config.max_seq_length
    for block in _blocks_of(rows, _BLOCK):
        keys = masking.hash_keys(unit_seed, index + np.arange(len(block)))
        features = pipeline.rows_to_features(block, keys, data_config, _WORKER["spec"])
        yield features, block[:, :length], block[:, length + instances.META_TRUNCATED]
        index += len(block)


def _records(masked, totals: stats.Accumulator):
    """Masked blocks -> the unit's records as feature blocks, counted in ``totals``: the masked
    instances, or with ``pack_sequences`` their packed rows, window by window."""
    from bertjax.data import pipeline

    data_config = _WORKER["data_config"]
    if not data_config.pack_sequences:
        for features, original_ids, truncated in masked:
            totals.add(features, original_ids=original_ids, truncated=truncated)
            yield features
        return
    for features, truncated in _windows(masked, pipeline.PACK_WINDOW):
        packed, truncated_per_row, ideal_rows = _pack(features, truncated, data_config)
        totals.add(packed, truncated=truncated_per_row)
        totals.counts["ideal_rows"] += ideal_rows
        yield packed


def _windows(masked, size: int):
    """Masked blocks -> ``(features, truncated)`` of ``size`` consecutive instances each (the
    last may be smaller): all that packing holds at once."""
    held: list[tuple[dict, np.ndarray]] = []
    count = 0
    for features, _, truncated in masked:
        held.append((features, truncated))
        count += len(truncated)
        while count >= size:
            features = {name: np.concatenate([f[name] for f, _ in held]) for name in held[0][0]}
            truncated = np.concatenate([t for _, t in held])
            yield {name: value[:size] for name, value in features.items()}, truncated[:size]
            rest = {name: value[size:].copy() for name, value in features.items()}  # not a view
            held = [(rest, truncated[size:].copy())]  # that would keep the whole window alive
            count -= size
    if count:
        features = {name: np.concatenate([f[name] for f, _ in held]) for name in held[0][0]}
        yield features, np.concatenate([t for _, t in held])


def _pack(features: dict, truncated: np.ndarray, data_config) -> tuple[dict, np.ndarray, int]:
    """A window's masked instances and their truncation flags -> its packed rows
    (``bertjax.data.packing``), each row's count of truncated instances, and the fewest rows any
    packing of the window could use."""
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


def _append_unit(pieces: list[shard_pieces.Piece], outputs: list) -> None:
    """Appends a unit's pieces to their open output shards, each checked first
    (``bertjax.data.shard_pieces``), and removes them."""
    shard_pieces.check(pieces)
    for piece in pieces:
        shard_pieces.append(piece, outputs[piece.shard])
        os.remove(piece.path)


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
            for stats, pieces in run(write_unit, units):  # in unit order
                _append_unit(pieces.pieces(scratch), outputs)
                total = stats if total is None else total.merge(stats)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return total.summary()
