"""Offline pretraining data: text corpus -> masked MLM+NSP TFRecords (the original's format).

    python -m bertjax.create_pretraining_data --input_file='corpus/*.txt.gz' \\
        --output_file=out/train.tfrecord --num_output_shards=8 --vocab_file=vocab.txt \\
        --do_lower_case --max_seq_length=128 --max_predictions_per_seq=20 --dupe_factor=10

Same flags as Google's ``create_pretraining_data.py`` (``--output_file`` may also be a comma list
of files, as there) plus ``--num_output_shards`` (``out.tfrecord-00003-of-00008``),
``--num_workers`` (default: every core) and ``--work_unit_bytes``. Records parse with the original
``run_pretraining.py`` spec (``bertjax.tfrecords``).

Unlike the original it streams with bounded memory and uses every core: one pass (no
tokenizing) cuts the corpus at document starts into work units of ``--work_unit_bytes`` of text
and at least 2 documents (``data_sources.work_units``); spawned worker processes (TensorFlow in
each) tokenize, pair, shuffle (a bounded buffer of ``--shuffle_buffer`` instances), mask and
serialize one unit at a time into scratch files, which this process appends to the output
shards in unit order. Record ``j`` of unit ``u`` goes to shard ``(u + j) % num_shards``, so
every shard holds a slice of every unit. All randomness is keyed by ``(--random_seed, unit)``:
the output is a pure function of the flags and the corpus, identical for any ``--num_workers``.
NotNext segments are drawn from up to ``--random_doc_pool`` documents around the current one
*within its unit* (the original: anywhere in the corpus held in RAM). Masks are static (one per
instance; each of ``dupe_factor`` copies has its own pairing and mask). A ``.gz`` input is
decompressed from its start by each of its units (cheap for files of up to a few hundred MB;
split larger ones). Shards are written under temporary names and renamed at the end. Prints
the ``bertjax.data_stats`` summary when done.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import random
import shutil
import sys
import tempfile

import numpy as np
from absl import flags

from bertjax import cli, data_sources, data_stats, masking, pretraining_data, tfrecords
from bertjax.pretraining_data import DataError

_FLAG_DEFS = (  # (definer, name, default, help); the original script's flags + a few more
    (flags.DEFINE_string, "input_file", None, "Input text file(s): GLOB[,GLOB...]; .gz ok."),
    (flags.DEFINE_string, "output_file", None, "Output TFRecord file, or a comma list of files."),
    (flags.DEFINE_integer, "num_output_shards", 1, "Shards of a single --output_file."),
    (flags.DEFINE_string, "vocab_file", None, "vocab.txt (wordpiece) or .model (sentencepiece)."),
    (flags.DEFINE_string, "tokenizer", "wordpiece", "wordpiece | sentencepiece."),
    (flags.DEFINE_bool, "do_lower_case", True, "Lower-case and strip accents."),
    (flags.DEFINE_bool, "do_whole_word_mask", False, "Mask all pieces of a word together."),
    (flags.DEFINE_integer, "max_seq_length", 128, "Maximum sequence length."),
    (flags.DEFINE_integer, "max_predictions_per_seq", 20, "Maximum predictions per sequence."),
    (flags.DEFINE_integer, "random_seed", 12345, "Seed for pairing, masking and shuffling."),
    (flags.DEFINE_integer, "dupe_factor", 10, "Pairings (each with its own mask) per document."),
    (flags.DEFINE_float, "masked_lm_prob", 0.15, "Masked LM probability."),
    (flags.DEFINE_float, "short_seq_prob", 0.1, "Probability of a shorter target length."),
    (flags.DEFINE_bool, "nsp", True, "Sentence pairs with NSP labels; False = single segments."),
    (flags.DEFINE_integer, "random_doc_pool", 1000, "Documents to draw NotNext segments from."),
    (flags.DEFINE_integer, "shuffle_buffer", 20000, "Instances in each unit's shuffle buffer."),
    (flags.DEFINE_integer, "num_workers", os.cpu_count() or 1, "Processes (default: all cores)."),
    (
        flags.DEFINE_integer,
        "work_unit_bytes",
        1 << 20,
        "Text per work unit (cut at document starts); changes the output, unlike num_workers.",
    ),
)


def define_flags(flag_values=flags.FLAGS) -> None:
    """Defines the flags on ``flag_values``. Only the CLI defines them globally, so importing
    this module never clashes with another tool's flags of the same names."""
    for definer, name, default, help_text in _FLAG_DEFS:
        definer(name, default, help_text, flag_values=flag_values)


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


_WORKER: dict = {}  # per process: the job, its tokenizer and masking spec (built once)


def _init_worker(job: Job) -> None:
    from bertjax import input_pipeline

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import ml_collections

    data_config = ml_collections.ConfigDict(job.data_config)
    tokenizer = data_sources.create_tokenizer(data_config)
    _WORKER.update(
        job=job,
        data_config=data_config,
        tokenizer=tokenizer,
        tokenize=pretraining_data.line_batch_tokenizer(tokenizer),
        spec=input_pipeline.masking_spec(data_config, tokenizer),
        options=data_sources.instance_options(data_config, tokenizer),
    )


def unit_shard_path(scratch_dir: str, unit: int, shard: int) -> str:
    return os.path.join(scratch_dir, f"unit-{unit:06d}-shard-{shard:05d}.tfrecord")


def write_unit(unit: data_sources.WorkUnit) -> data_stats.Accumulator:
    """Pairs, shuffles, masks and serializes one unit into per-shard scratch files.

    Everything is keyed by ``(seed, unit.index)``: pairing seed, shuffle order, masks, and the
    shard of the unit's ``j``-th record (``(unit.index + j) % num_shards``), so the output does
    not depend on which worker ran the unit or when.
    """
    import tensorflow as tf

    from bertjax import input_pipeline

    job, data_config, tokenizer = _WORKER["job"], _WORKER["data_config"], _WORKER["tokenizer"]
    length = data_config.max_seq_length
    unit_seed = int(masking.hash_keys(job.seed, unit.index))
    documents = data_sources.unit_documents(unit, _WORKER["tokenize"])
    blocks = pretraining_data.generate_instances(
        documents, unit_seed, _WORKER["options"], unit.describe()
    )
    rows = shuffled(blocks, job.shuffle_buffer, random.Random(unit_seed))
    stats = data_stats.Accumulator(length, tokenizer)
    writers, index = {}, 0
    try:
        for block in _blocks_of(rows, _BLOCK):
            keys = masking.hash_keys(unit_seed, index + np.arange(len(block)))
            features = input_pipeline.rows_to_features(block, keys, data_config, _WORKER["spec"])
            stats.add(features, original_ids=block[:, :length], truncated=block[:, length + 3])
            for r, record in enumerate(tfrecords.serialize_rows(features)):
                shard = (unit.index + index + r) % job.num_shards
                if shard not in writers:
                    path = unit_shard_path(job.scratch_dir, unit.index, shard)
                    writers[shard] = tf.io.TFRecordWriter(path)
                writers[shard].write(record)
            index += len(block)
    finally:
        for writer in writers.values():
            writer.close()
    return stats


@contextlib.contextmanager
def _workers(job: Job, num_workers: int):
    """Yields ``run(units) -> accumulators in unit order``: here (1 worker) or in ``num_workers``
    spawned processes (TensorFlow in each; ``imap`` keeps the order)."""
    if num_workers <= 1:
        _init_worker(job)
        yield lambda units: map(write_unit, units)
        return
    context = multiprocessing.get_context("spawn")  # fork after TensorFlow's threads is unsafe
    with context.Pool(num_workers, _init_worker, (job,)) as pool:
        yield lambda units: pool.imap(write_unit, units)


def _append(source: str, destination) -> None:
    """Appends a scratch TFRecord file to ``destination`` and removes it (TFRecord files are
    self-delimiting records, so concatenated files are one valid file)."""
    if os.path.exists(source):
        with open(source, "rb") as f:
            shutil.copyfileobj(f, destination, 1 << 22)
        os.remove(source)


def _rename(source: str, destination: str) -> None:
    if data_sources.is_local(destination):
        os.replace(source, destination)
    else:
        import tensorflow as tf

        tf.io.gfile.rename(source, destination, overwrite=True)


def _remove_if_exists(path: str) -> None:
    if data_sources.is_local(path):
        if os.path.exists(path):
            os.remove(path)
        return
    import tensorflow as tf

    if tf.io.gfile.exists(path):
        tf.io.gfile.remove(path)


def write_tfrecords(
    data_config,
    paths: list[str],
    seed: int,
    shuffle_buffer: int,
    num_workers: int = 1,
    unit_bytes: int = 1 << 20,
) -> dict:
    """Tokenizes, pairs, masks and writes ``paths``; returns the statistics of what was written.

    The corpus is cut into work units (``data_sources.work_units``) that ``num_workers``
    processes turn into scratch shards; this process appends them to the outputs in unit order
    (and deletes them), so the output is the same for any ``num_workers``. With local paths
    this process never imports TensorFlow (seconds of CPU that the workers need).
    """
    scratch = tempfile.mkdtemp(prefix="bertjax-pretraining-data-")
    job = Job(data_config.to_dict(), seed, shuffle_buffer, len(paths), scratch)
    temporary = [f"{p}.tmp-{os.getpid()}" for p in paths]
    outputs, total = [], None
    try:
        files = data_sources.resolve_files(data_config.input_files, "input_files")
        units = data_sources.work_units(files, unit_bytes)
        if not units:
            raise DataError(f"data.input_files {files}: no documents (empty input)")
        # No more processes than units: each costs a TensorFlow start-up (~3-6 s of CPU).
        with _workers(job, min(num_workers, len(units))) as run_units:
            outputs = [data_sources.open_file(p, "wb") for p in temporary]
            for unit, stats in zip(units, run_units(units), strict=True):
                for shard, output in enumerate(outputs):
                    _append(unit_shard_path(scratch, unit.index, shard), output)
                total = stats if total is None else total.merge(stats)
        for output in outputs:
            output.close()
        for tmp, path in zip(temporary, paths, strict=True):
            _rename(tmp, path)
    finally:  # after a failure: no half-written shard is left behind
        for output in outputs:  # empty when the failure came before the outputs were opened
            output.close()
        for tmp in temporary:
            _remove_if_exists(tmp)
        shutil.rmtree(scratch, ignore_errors=True)
    return total.summary()


def data_config_from_flags(values):
    """A ``config.data``-shaped ConfigDict from the command-line flags."""
    import ml_collections

    for name in ("input_file", "output_file", "vocab_file"):
        if not getattr(values, name):
            raise DataError(f"--{name} is required")
    return ml_collections.ConfigDict(
        dict(
            source="text",
            input_files=values.input_file,
            vocab_file=values.vocab_file,
            tokenizer=values.tokenizer,
            do_lower_case=values.do_lower_case,
            do_whole_word_mask=values.do_whole_word_mask,
            max_seq_length=values.max_seq_length,
            max_predictions_per_seq=values.max_predictions_per_seq,
            masked_lm_prob=values.masked_lm_prob,
            short_seq_prob=values.short_seq_prob,
            dupe_factor=values.dupe_factor,
            nsp=values.nsp,
            random_doc_pool=values.random_doc_pool,
            objective="mlm",
            masking="static",
        )
    )


def run(values) -> int:
    """The tool on parsed flag ``values``; returns the exit code (errors go to stderr)."""
    try:
        data_config = data_config_from_flags(values)
        paths = output_paths(values.output_file, values.num_output_shards)
        for directory in {os.path.dirname(p) for p in paths if os.path.dirname(p)}:
            os.makedirs(directory, exist_ok=True)
        if values.num_workers < 1 or values.work_unit_bytes < 1:
            raise DataError("--num_workers and --work_unit_bytes must be >= 1")
        summary = write_tfrecords(
            data_config,
            paths,
            values.random_seed,
            values.shuffle_buffer,
            num_workers=values.num_workers,
            unit_bytes=values.work_unit_bytes,
        )
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {len(paths)} file(s): {', '.join(paths)}")
    print(data_stats.format_summary(summary))
    return 0


if __name__ == "__main__":
    cli.run(run, define_flags, errors=(DataError,), prog="create_pretraining_data")
