"""Builds a WordPiece vocab (or trains a SentencePiece model) from a plain-text corpus.

    python -m bertjax.vocab --input_file='corpus/*.txt,extra.txt.gz' --output_file=vocab.txt \\
        --vocab_size=8000 [--do_lower_case=true] [--type=wordpiece|sentencepiece] [--num_unused=0]

The vocab's layout and how it is learned: ``bertjax.data.vocab``. TensorFlow is imported only
after the flags are parsed, so ``--help`` answers at once.
"""

from __future__ import annotations

from absl import flags

from bertjax import cli

_FLAG_DEFS = (  # (definer, name, default, help)
    (flags.DEFINE_string, "input_file", None, "Corpus files: GLOB[,GLOB...]; *.gz are gunzipped."),
    (flags.DEFINE_string, "output_file", None, "vocab.txt (wordpiece) or .model (sentencepiece)."),
    (flags.DEFINE_integer, "vocab_size", None, "Maximum vocab size, special tokens included."),
    (flags.DEFINE_bool, "do_lower_case", True, "Uncased (lowercase + strip accents) or cased."),
    (flags.DEFINE_string, "type", "wordpiece", "Tokenizer type: wordpiece | sentencepiece."),
    (flags.DEFINE_integer, "num_unused", 0, "WordPiece only: [unusedK] slots after the specials."),
)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Only the CLI defines its flags globally, so importing never clashes with other tools."""
    for definer, name, default, help_text in _FLAG_DEFS:
        definer(name, default, help_text, flag_values=flag_values)


def _run_checked(fv: flags.FlagValues) -> str:
    for name in ("input_file", "output_file", "vocab_size"):
        if getattr(fv, name) is None:
            raise ValueError(f"--{name} is required")
    if fv.vocab_size <= 0 or fv.num_unused < 0:
        raise ValueError("--vocab_size must be > 0 and --num_unused >= 0")
    if fv.type not in ("wordpiece", "sentencepiece"):
        raise ValueError(f"--type={fv.type}: expected wordpiece or sentencepiece")
    from bertjax.data import vocab  # TensorFlow: only after the flags parsed

    files = vocab.expand_globs(fv.input_file)
    if fv.type == "sentencepiece":
        vocab.train_sentencepiece(files, fv.output_file, fv.vocab_size, fv.do_lower_case)
        return f"wrote sentencepiece model {fv.output_file}"
    tokens = vocab.build_wordpiece_vocab(files, fv.vocab_size, fv.do_lower_case, fv.num_unused)
    vocab.write_vocab(tokens, fv.output_file)
    return f"wrote {len(tokens)} tokens to {fv.output_file}"


def run(flag_values: flags.FlagValues) -> int:
    """The command on parsed flags; bad input raises ValueError (one line, exit 1)."""
    print(_run_checked(flag_values))
    return 0


def main() -> None:
    cli.run(run, define_flags, prog="vocab")


if __name__ == "__main__":
    main()
