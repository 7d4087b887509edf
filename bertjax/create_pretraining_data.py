"""Offline pretraining data: text corpus -> masked MLM+NSP TFRecords (the original's format).

    python -m bertjax.create_pretraining_data --input_file='corpus/*.txt.gz' \\
        --output_file=out/train.tfrecord --num_output_shards=8 --vocab_file=vocab.txt \\
        --do_lower_case --max_seq_length=128 --max_predictions_per_seq=20 --dupe_factor=10

Same flags as Google's ``create_pretraining_data.py`` (``--output_file`` may also be a comma list
of files, as there) plus ``--num_output_shards`` (``out.tfrecord-00003-of-00008``),
``--num_workers`` (default 0: every core, at most one per unit, ``offline.default_workers``),
``--work_unit_bytes``, ``--runner`` with ``--beam_pipeline_options`` (or Beam's options after
``--``: ``bertjax.data.beam_pipeline``), the pairing options ``--nsp``, ``--random_doc_pool``
and ``--split_single_sentence`` (``bertjax.data.instances``; the defaults pair as the original
does), and ``--pack_sequences`` with ``--max_sequences_per_pack`` (packed rows:
``bertjax.data.packing``). How the records are made, in parallel with bounded memory and
identical for any ``--num_workers``: ``bertjax.data.offline``.
"""

from __future__ import annotations

import os

from absl import flags

from bertjax import cli
from bertjax.data import beam_pipeline  # no Beam import: runner names and help only

_FLAG_DEFS = (  # (definer, name, default, help); the original script's flags + a few more
    (flags.DEFINE_string, "input_file", None, "Input text file(s): GLOB[,GLOB...]; .gz ok."),
    (flags.DEFINE_string, "output_file", None, "Output TFRecord file, or a comma list of files."),
    (flags.DEFINE_integer, "num_output_shards", 1, "Shards of a single --output_file."),
    (flags.DEFINE_string, "vocab_file", None, "vocab.txt (wordpiece) or .model (sentencepiece)."),
    (flags.DEFINE_string, "tokenizer", "wordpiece", "wordpiece | sentencepiece | bpe."),
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
    (
        flags.DEFINE_bool,
        "split_single_sentence",
        False,
        "A one-sentence chunk may be IsNext, split in two (50/50 NSP); default: always NotNext.",
    ),
    (
        flags.DEFINE_bool,
        "pack_sequences",
        False,
        "Write rows of up to --max_sequences_per_pack whole instances (bertjax.data.packing).",
    ),
    (
        flags.DEFINE_integer,
        "max_sequences_per_pack",
        None,
        "K: instances per packed row at most; default ceil(max_seq_length / 32) as in configs.",
    ),
    (flags.DEFINE_integer, "shuffle_buffer", 20000, "Instances in each unit's shuffle buffer."),
    (
        flags.DEFINE_string,
        "runner",
        "local",
        f"{beam_pipeline.RUNNER_HELP} (bertjax.data.offline_beam; the same bytes).",
    ),
    (flags.DEFINE_string, "beam_pipeline_options", "", beam_pipeline.OPTIONS_HELP),
    (
        flags.DEFINE_integer,
        "num_workers",
        0,
        "Worker processes; 0: every core, but no more than the corpus's work units (estimated).",
    ),  # fmt: skip
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


def data_config_from_flags(values):
    """A ``config.data``-shaped ConfigDict from the command-line flags."""
    import ml_collections

    from bertjax.data import packing

    for name in ("input_file", "output_file", "vocab_file"):
        if not getattr(values, name):
            raise ValueError(f"--{name} is required")
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
            split_single_sentence=values.split_single_sentence,
            pack_sequences=values.pack_sequences,
            max_sequences_per_pack=values.max_sequences_per_pack
            or packing.default_pack_width(values.max_seq_length),
            objective="mlm",
            masking="static",
        )
    )


def run(values) -> int:
    """The command on parsed flag ``values``; bad input raises ValueError (DataError)."""
    from bertjax import startup
    from bertjax.data import offline, sources, stats  # no TensorFlow: the workers import it

    beam_pipeline.check_runner(values.runner, values.beam_pipeline_options)
    if values.runner != "local":
        beam_pipeline.require(values.runner)  # one line without the beam extra
    data_config = data_config_from_flags(values)
    paths = offline.output_paths(values.output_file, values.num_output_shards)
    named = [*paths, *values.input_file.split(","), values.vocab_file]
    if not all(sources.is_local(p) for p in named):  # gs:// goes through tf.io.gfile here too
        startup.import_tensorflow()
    for directory in {os.path.dirname(p) for p in paths if os.path.dirname(p)}:
        if sources.is_local(directory):  # a gs:// "directory" is a prefix: nothing to create
            os.makedirs(directory, exist_ok=True)
    if values.num_workers < 0 or values.work_unit_bytes < 1:
        raise ValueError("--num_workers must be >= 0 (0: chosen) and --work_unit_bytes >= 1")
    if values.max_sequences_per_pack is not None and values.max_sequences_per_pack < 1:
        raise ValueError(f"--max_sequences_per_pack={values.max_sequences_per_pack}: need >= 1")
    if values.runner == "local":
        summary = offline.write_tfrecords(
            data_config,
            paths,
            values.random_seed,
            values.shuffle_buffer,
            num_workers=values.num_workers,
            unit_bytes=values.work_unit_bytes,
        )
    else:
        from bertjax.data import offline_beam

        print(f"Beam: --runner={values.runner} {values.beam_pipeline_options}".rstrip(), flush=True)
        summary = offline_beam.write_tfrecords(
            data_config, paths, values.random_seed, values.shuffle_buffer,
            unit_bytes=values.work_unit_bytes, runner=values.runner,
            pipeline_options=values.beam_pipeline_options,
        )  # fmt: skip
    print(f"wrote {len(paths)} file(s): {', '.join(paths)}")
    print(stats.format_summary(summary))
    return 0


def main() -> None:
    # This process only lists the files' sizes and appends the workers' shards: with local paths
    # it never imports TensorFlow (4-5 s and ~700 MiB it would spend for nothing).
    cli.run(
        run, define_flags, prog="create_pretraining_data", tensorflow=False,
        rest_flag="beam_pipeline_options",
    )  # fmt: skip


if __name__ == "__main__":
    main()
