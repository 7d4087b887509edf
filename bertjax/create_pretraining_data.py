"""Offline pretraining data: text corpus -> masked MLM+NSP TFRecords (the original's format).

    python -m bertjax.create_pretraining_data --input_file='corpus/*.txt.gz' \\
        --output_file=out/train.tfrecord --num_output_shards=8 --vocab_file=vocab.txt \\
        --do_lower_case --max_seq_length=128 --max_predictions_per_seq=20 --dupe_factor=10

Same flags as Google's ``create_pretraining_data.py`` (``--output_file`` may also be a comma list
of files, as there) plus ``--num_output_shards`` (``out.tfrecord-00003-of-00008``). Records parse
with the original ``run_pretraining.py`` spec (``bertjax.tfrecords``). Unlike the original it
streams: documents are tokenized in ``tf.data`` (multi-threaded, the second core) while pairing,
masking and writing run in this process, with a bounded shuffle buffer (``--shuffle_buffer``
instances) instead of shuffling everything in RAM. Masks are static (one per instance; each of
``dupe_factor`` copies has its own pairing and mask). Shards are written under temporary names and
renamed at the end. Prints the ``bertjax.data_stats`` summary when done.
"""

from __future__ import annotations

import os
import random
import sys

import numpy as np
from absl import app, flags

from bertjax import data_sources, data_stats, masking, pretraining_data, tfrecords
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
    (flags.DEFINE_integer, "shuffle_buffer", 20000, "Instances in the streaming shuffle buffer."),
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


def write_tfrecords(data_config, paths: list[str], seed: int, shuffle_buffer: int) -> dict:
    """Tokenizes, pairs, masks and writes; returns the statistics of what was written."""
    import tensorflow as tf

    from bertjax import input_pipeline

    tokenizer = data_sources.create_tokenizer(data_config)
    spec = input_pipeline.masking_spec(data_config, tokenizer)
    documents, source = data_sources.read_documents(data_config, tokenizer, "train")
    options = data_sources.instance_options(data_config, tokenizer)
    blocks = pretraining_data.generate_instances(documents, seed, options, source)
    rows = shuffled(blocks, shuffle_buffer, random.Random(seed))
    stats = data_stats.Accumulator(data_config.max_seq_length, tokenizer)
    temporary = [f"{p}.tmp-{os.getpid()}" for p in paths]
    writers = [tf.io.TFRecordWriter(p) for p in temporary]
    index = 0
    try:
        for block in _blocks_of(rows, _BLOCK):
            keys = masking.hash_keys(seed, index + np.arange(len(block)))
            features = input_pipeline.rows_to_features(block, keys, data_config, spec)
            stats.add(
                features,
                original_ids=block[:, : data_config.max_seq_length],
                truncated=block[:, data_config.max_seq_length + 3],
            )
            for r in range(len(block)):
                writers[(index + r) % len(writers)].write(tfrecords.serialize(features, r))
            index += len(block)
        for writer in writers:
            writer.close()
        for tmp, path in zip(temporary, paths, strict=True):
            os.replace(tmp, path)
    finally:  # after a failure: no half-written shard is left behind
        for writer, tmp in zip(writers, temporary, strict=True):
            if os.path.exists(tmp):
                writer.close()
                os.remove(tmp)
    return stats.summary()


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
        summary = write_tfrecords(data_config, paths, values.random_seed, values.shuffle_buffer)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {len(paths)} file(s): {', '.join(paths)}")
    print(data_stats.format_summary(summary))
    return 0


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    return run(flags.FLAGS)


if __name__ == "__main__":
    define_flags()
    app.run(lambda argv: sys.exit(main(argv)))
