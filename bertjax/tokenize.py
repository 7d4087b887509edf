"""Tokenizes stdin line by line: one line of space-separated WordPiece ids per input line.

    python -m bertjax.tokenize --vocab_file=vocab.txt [--do_lower_case=true|false] < in.txt

No special tokens are added; an empty input line gives an empty output line. Ids are those of
HuggingFace ``BertTokenizerFast(vocab_file, do_lower_case)`` (see ``bertjax.data.tokenization``).
"""

from __future__ import annotations

import sys
from typing import BinaryIO, TextIO

from absl import flags

from bertjax import cli


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Only the CLI defines its flags globally, so importing never clashes with other tools."""
    flags.DEFINE_string(
        "vocab_file", None, "WordPiece vocab.txt (one token per line).", flag_values=flag_values
    )
    flags.DEFINE_bool(
        "do_lower_case",
        True,
        "Uncased (lowercase + strip accents) or cased.",
        flag_values=flag_values,
    )


def run(flag_values: flags.FlagValues, stdin: BinaryIO, stdout: TextIO) -> int:
    """The command on parsed flags; bad input raises ValueError (TokenizerError)."""
    from bertjax.data import tokenization  # TensorFlow: only after the flags parsed

    if not flag_values.vocab_file:
        raise ValueError("--vocab_file is required")
    tokenizer = tokenization.WordPieceTokenizer(flag_values.vocab_file, flag_values.do_lower_case)
    tokenization.tokenize_stream(tokenizer, stdin, stdout)
    return 0


def main() -> None:  # also the console script bertjax-tokenize
    cli.run(lambda fv: run(fv, sys.stdin.buffer, sys.stdout), define_flags, prog="tokenize")


if __name__ == "__main__":
    main()
