"""Feature extraction: per-token activations of chosen layers, like Google's extract_features.py.

    python -m bertjax.extract_features --input_file=in.txt --output_file=out.jsonl \\
        --checkpoint=DIR [--layers=-1,-2,-3,-4] [--max_seq_length=128] [--batch_size=8] \\
        [--vocab_file=V] [--do_lower_case=true|false] [--pack_sequences]

Flags and messages only: what the output holds, layer indexes, truncation and packing are
``bertjax.finetune.features``'s docstring.
"""

from __future__ import annotations

from absl import flags

from bertjax import cli


def parse_layers(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--layers={text!r}: expected comma-separated integers") from None


def _define_flags() -> None:
    flags.DEFINE_string("input_file", None, "Text file: one sequence per line, 'A ||| B' pairs.")
    flags.DEFINE_string("output_file", None, "JSON lines output (written atomically).")
    flags.DEFINE_string("checkpoint", None, "bertjax params-only checkpoint or HF directory.")
    flags.DEFINE_string("layers", "-1,-2,-3,-4", "Comma-separated layer indexes (-1 = last).")
    flags.DEFINE_string("vocab_file", None, "WordPiece vocab; default: the checkpoint's.")
    flags.DEFINE_boolean("do_lower_case", None, "Lower-case input; default: the checkpoint's.")
    flags.DEFINE_integer("max_seq_length", 128, "Word pieces per example incl. [CLS]/[SEP].")
    flags.DEFINE_integer("batch_size", 8, "Rows per forward pass.")
    flags.DEFINE_boolean("pack_sequences", False, "Pack whole examples into rows (same output).")
    flags.DEFINE_integer("max_sequences_per_pack", 0,
                         "--pack_sequences: examples per row; 0: ceil(max_seq_length / 32), as "
                         "the configs' default")  # fmt: skip
    flags.mark_flags_as_required(["input_file", "output_file", "checkpoint"])


def _run(fv: flags.FlagValues) -> None:
    from bertjax.finetune.features import extract  # noqa: PLC0415 - JAX, after the flags parse

    n = extract(fv.checkpoint, fv.input_file, fv.output_file, parse_layers(fv.layers),
                fv.max_seq_length, fv.batch_size, fv.vocab_file, fv.do_lower_case,
                fv.pack_sequences, fv.max_sequences_per_pack)  # fmt: skip
    print(f"wrote features of {n} lines to {fv.output_file}")


def main() -> None:  # also the console script bertjax-extract-features
    # ExtractError, ConvertError, TokenizerError are ValueErrors: one line, no traceback.
    cli.run(_run, _define_flags, prog="extract_features")


if __name__ == "__main__":
    main()
