"""Checkpoint conversion: HuggingFace and Google's original TF1 BERT checkpoints <-> bertjax.

    python -m bertjax.convert --src=PATH --dst=DIR --to=bertjax|hf [--from=hf|tf1|bertjax|workdir]
        [--do_lower_case=true|false] [--overwrite]

Sources are detected from their files when ``--from`` is absent: a HF directory, Google's TF1
release (a directory or checkpoint prefix), a bertjax params-only checkpoint, or a training
workdir (its newest verified step). ``--to=hf`` writes the class that matches the heads:
``BertForPreTraining``, ``BertModel``, or a fine-tuned checkpoint's
``BertForSequenceClassification`` / ``BertForTokenClassification`` /
``BertForQuestionAnswering`` / ``BertForMultipleChoice`` with its labels. The formats and their
rules are ``bertjax.interop``'s (this module holds only the flags and messages); any bad input
is one line naming the file and key, and leaves nothing at ``--dst``.
"""

from __future__ import annotations

from absl import flags

from bertjax import cli
from bertjax.interop import formats
from bertjax.interop.converted import ConvertError


def _define_flags() -> None:
    """Only when run as a CLI, so importing this module adds no flags."""
    flags.DEFINE_string("src", None, "Source checkpoint directory (or TF1 checkpoint prefix).")
    flags.DEFINE_string("dst", None, "Destination directory (must not exist unless --overwrite).")
    flags.DEFINE_enum("to", None, list(formats.DESTINATIONS), "Destination format.")
    flags.DEFINE_enum(
        "from", None, list(formats.SOURCES), "Source format; detected from the files when absent."
    )
    flags.DEFINE_boolean(
        "do_lower_case",
        None,
        "Casing of the vocab when the source does not record it (TF1, HF "
        "without tokenizer_config.json).",
    )
    flags.DEFINE_boolean("overwrite", False, "Replace --dst if it exists.")
    flags.mark_flags_as_required(["src", "dst", "to"])


def _run(fv: flags.FlagValues) -> None:
    out = formats.convert(fv.src, fv.dst, fv.to, fv["from"].value, fv.do_lower_case, fv.overwrite)
    print(f"wrote {fv.to} checkpoint to {out}")


def main() -> None:  # also the console script bertjax-convert
    cli.run(_run, _define_flags, errors=(ConvertError,), prog="convert", tensorflow=False)


if __name__ == "__main__":
    main()
