"""Builds a WordPiece vocab (or trains a SentencePiece model or a byte-level BPE tokenizer.json,
as ModernBERT's) from a plain-text corpus.

    python -m bertjax.vocab --input_file='corpus/*.txt,extra.txt.gz' --output_file=vocab.txt \\
        --vocab_size=8000 [--do_lower_case=true] [--type=wordpiece|sentencepiece|bpe]
        [--num_unused=0]
        [--runner=local|DirectRunner|DataflowRunner|... [--beam_pipeline_options=... | -- ...]]

The vocab's layout and how it is learned: ``bertjax.data.vocab``. With a Beam ``--runner`` the
corpus is read and counted (or sampled) by Beam's workers, which send here only what the learner
uses, and the learner runs here, giving the same vocab (``bertjax.data.vocab_beam``). TensorFlow
is imported only after the flags are parsed, so ``--help`` answers at once.
"""

from __future__ import annotations

from absl import flags

from bertjax import cli
from bertjax.data import beam_pipeline  # no Beam import: runner names and help only

_FLAG_DEFS = (  # (definer, name, default, help)
    (flags.DEFINE_string, "input_file", None, "Corpus files: GLOB[,GLOB...]; *.gz are gunzipped."),
    (
        flags.DEFINE_string,
        "output_file",
        None,
        "vocab.txt (wordpiece), .model (sentencepiece) or tokenizer.json (bpe).",
    ),  # fmt: skip
    (flags.DEFINE_integer, "vocab_size", None, "Maximum vocab size, special tokens included."),
    (flags.DEFINE_bool, "do_lower_case", True, "Uncased (lowercase + strip accents) or cased."),
    (flags.DEFINE_string, "type", "wordpiece", "Tokenizer type: wordpiece | sentencepiece | bpe."),
    (flags.DEFINE_integer, "num_unused", 0, "WordPiece only: [unusedK] slots after the specials."),
    (flags.DEFINE_string, "runner", "local", f"{beam_pipeline.RUNNER_HELP}; the same vocab."),
    (flags.DEFINE_string, "beam_pipeline_options", "", beam_pipeline.OPTIONS_HELP),
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
    if fv.type not in ("wordpiece", "sentencepiece", "bpe"):
        raise ValueError(f"--type={fv.type}: expected wordpiece, sentencepiece or bpe")
    if fv.type == "bpe" and fv.runner != "local":
        raise ValueError(f"--type=bpe --runner={fv.runner}: BPE is learnt here (--runner=local)")
    beam_pipeline.check_runner(fv.runner, fv.beam_pipeline_options)
    if fv.runner != "local":
        beam_pipeline.require(fv.runner)  # one line without the beam extra
    from bertjax.data import vocab  # TensorFlow: only after the flags parsed

    files = vocab.expand_globs(fv.input_file)
    if fv.type == "wordpiece":
        vocab.check_wordpiece_size(fv.vocab_size, fv.num_unused)
    if fv.runner != "local":
        print(f"Beam: --runner={fv.runner} {fv.beam_pipeline_options}".rstrip(), flush=True)
    if fv.type == "bpe":
        vocab.train_bpe(files, fv.output_file, fv.vocab_size, fv.do_lower_case)
        return f"wrote byte-level BPE tokenizer {fv.output_file}"
    if fv.type == "sentencepiece":
        sentences = _sentence_sample(fv, files)
        vocab.train_sentencepiece(sentences, files, fv.output_file, fv.vocab_size, fv.do_lower_case)
        return f"wrote sentencepiece model {fv.output_file}"
    given = _learner_input(fv, files)
    tokens = vocab.learn_wordpiece(given, fv.vocab_size, fv.num_unused, files)
    vocab.write_vocab(tokens, fv.output_file)
    return f"wrote {len(tokens)} tokens to {fv.output_file}"


def _learner_input(fv: flags.FlagValues, files: list[str]):
    """What the WordPiece learner uses of the word counts, counted here (``--runner=local``) or
    by Beam's workers: the same."""
    from bertjax.data import vocab

    if fv.runner == "local":
        return vocab.learner_input(vocab.count_words(files, fv.do_lower_case), fv.num_unused)
    from bertjax.data import vocab_beam

    beam = (fv.output_file, fv.runner, fv.beam_pipeline_options)
    return vocab_beam.learner_input(files, fv.do_lower_case, fv.num_unused, *beam)


def _sentence_sample(fv: flags.FlagValues, files: list[str]) -> list[str]:
    """Drawn here (``--runner=local``) or by Beam's workers: the same sample."""
    from bertjax.data import vocab

    if fv.runner == "local":
        return vocab.sample_sentences(vocab.read_sentences(files))
    from bertjax.data import vocab_beam

    return vocab_beam.sample_sentences(files, fv.output_file, fv.runner, fv.beam_pipeline_options)


def run(flag_values: flags.FlagValues) -> int:
    """The command on parsed flags; bad input raises ValueError (one line, exit 1)."""
    print(_run_checked(flag_values))
    return 0


def main() -> None:
    cli.run(run, define_flags, prog="vocab", rest_flag="beam_pipeline_options")


if __name__ == "__main__":
    main()
