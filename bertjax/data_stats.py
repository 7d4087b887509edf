"""What a user needs to trust a pretraining dataset, for TFRecords or the online pipeline.

    python -m bertjax.data_stats --input_file='out/*.tfrecord*' --vocab_file=vocab.txt \\
        --max_seq_length=128 --max_predictions_per_seq=20
    python -m bertjax.data_stats --config=configs/base.py --num_batches=100 [--split=eval]

What is counted and how: ``bertjax.data.stats``.
"""

from __future__ import annotations

from absl import flags

from bertjax import cli


def define_flags(flag_values=flags.FLAGS) -> None:
    """Defines the CLI flags on ``flag_values`` (only the CLI uses the global ones, so other
    modules importing this one never clash on flag names)."""
    from ml_collections import config_flags

    fv = flag_values
    flags.DEFINE_string("input_file", None, "TFRecord files: GLOB[,GLOB...].", flag_values=fv)
    flags.DEFINE_string("vocab_file", None, "TFRecords: their vocab.", flag_values=fv)
    flags.DEFINE_string(
        "tokenizer", "wordpiece", "wordpiece | sentencepiece | bpe.", flag_values=fv
    )
    flags.DEFINE_bool("do_lower_case", True, "Tokenizer casing.", flag_values=fv)
    flags.DEFINE_integer("max_seq_length", 128, "TFRecords: L.", flag_values=fv)
    flags.DEFINE_integer("max_predictions_per_seq", 20, "TFRecords: P.", flag_values=fv)
    config_flags.DEFINE_config_file(
        "config", None, "Online pipeline: a configs/*.py file.", flag_values=fv
    )
    flags.DEFINE_integer("num_batches", 100, "Online pipeline: batches of 64.", flag_values=fv)
    flags.DEFINE_string("split", "train", "Online pipeline: train | eval.", flag_values=fv)


def run(f) -> int:
    """The command on parsed flag values ``f``; bad input raises ValueError (DataError)."""
    import ml_collections

    from bertjax.data import sources, stats, tfrecords  # TensorFlow: after the flags parsed

    if f.config is not None:
        summary = stats.pipeline_stats(f.config, f.split, f.num_batches)
    elif f.input_file and f.vocab_file:
        data = ml_collections.ConfigDict(
            dict(
                input_files=f.input_file,
                vocab_file=f.vocab_file,
                tokenizer=f.tokenizer,
                do_lower_case=f.do_lower_case,
                max_seq_length=f.max_seq_length,
                max_predictions_per_seq=f.max_predictions_per_seq,
            )
        )
        files = tfrecords.check_tfrecords(data)
        summary = stats.tfrecord_stats(files, data, sources.create_tokenizer(data))
    else:
        raise ValueError("give --config=FILE, or --input_file=GLOB with --vocab_file=FILE")
    print(stats.format_summary(summary))
    return 0


def main() -> None:
    cli.run(run, define_flags, prog="data_stats")


if __name__ == "__main__":
    main()
