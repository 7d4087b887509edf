"""The vocab builder's corpus reading on Apache Beam: ``python -m bertjax.vocab --runner=<runner>``.

What runs where:

- **Beam's workers** cut the corpus into work units (``bertjax.data.work_units``, 16 MB of text;
  a ``.gz`` input into plain pieces, as the offline builder does) and read it one unit at a time.
  For WordPiece they normalise, split and count its words (``vocab.WordCounter``, the tokenizer's
  own code), sum the counts by word (``CombinePerKey(sum)``) and keep only what the learner uses
  of them (``vocab.LearnerInput``), every step distributed:

      counts = units | CountWords | CombinePerKey(sum)           (word, count), one per word
      counts | Values | CombineGlobally(_Range)                  the lowest and highest count
      inputs = counts | Filter(vocab.is_input_word)               not too long, not reserved
      inputs | FlatMap(vocab.char_counts) | CombinePerKey(sum)
             | ToDict | Map(vocab.allowed_chars)                 the alphabet (a few thousand)
      usable = inputs | Filter(vocab.is_usable, alphabet)
      usable | Map(count -> (count, 1)) | CombinePerKey(sum)
             | ToDict | Map(vocab.input_cut)                      words per count -> the cut
      usable | Filter(count > cut) | ToList                       the words above the cut
      usable | Filter(count == cut) | Top.Smallest(MAX_INPUT_TOKENS) | Map(first cut.ties)

  So no worker gathers every distinct word: the words per count hold at most one entry per
  distinct count (at most ``sqrt(2 N)`` for ``N`` words of text), and what is gathered at the end
  is at most ``vocab.MAX_INPUT_TOKENS`` words, whatever the corpus. For SentencePiece they draw
  the sample (``Top.Smallest`` by ``vocab.sentence_key``).
- **This process** lists the files' sizes (``work_units.spans``) and runs the learner on what
  comes back: tensorflow-text's WordPiece learner on those words, or SentencePiece's trainer on
  the sample. Both are single-process libraries; it needs memory for at most
  ``vocab.MAX_INPUT_TOKENS`` words or ``vocab.SENTENCE_SAMPLE`` lines.

The vocab is the one ``--runner=local`` builds, byte for byte (``bertjax.data.vocab``: the same
``LearnerInput`` functions, and the sample is order-free; tested on DirectRunner).

tensorflow-text's own Beam vocab generator (``tools/wordpiece_vocab/generate_vocab.py`` in its
repository) has the same shape: its learner also runs in one place after a global combine. It is
not in the tensorflow-text wheel, needs tensorflow-transform, reads tf.Examples with language codes
and applies its own normalisation and per-language smoothing, so it would not give the vocab that
BERT's tokenizer and ``--runner=local`` expect.
"""

from __future__ import annotations

import apache_beam as beam  # the command has called beam_pipeline.require
import numpy as np

from bertjax.data import beam_pipeline, vocab, work_units

UNIT_BYTES = 16 << 20  # the result does not depend on it: counts add up, the sample is order-free
_BATCH_LINES = 4096


class _CountWords(beam.DoFn):
    """A unit -> ``(word, count)`` of its lines."""

    def __init__(self, do_lower_case: bool):
        self.do_lower_case = do_lower_case

    def setup(self):
        self.counter = vocab.WordCounter(self.do_lower_case)  # once per worker: one trace

    def process(self, unit):
        # DataError naming the file and byte if not UTF-8
        for lines in work_units.line_batches(unit, _BATCH_LINES):
            self.counter.add(np.array(lines, dtype=object))
        yield from self.counter.take().items()


class _Range(beam.CombineFn):
    """Counts -> ``(lowest, highest)``; ``(None, None)`` for none."""

    def create_accumulator(self):
        return None, None

    def add_input(self, accumulator, count):
        return self.merge_accumulators([accumulator, (count, count)])

    def merge_accumulators(self, accumulators):
        pairs = [pair for pair in accumulators if pair[0] is not None]
        if not pairs:
            return None, None
        return min(low for low, _ in pairs), max(high for _, high in pairs)

    def extract_output(self, accumulator):
        return accumulator


def _keyed_sentences(unit):
    """A unit -> ``vocab.sentence_key`` of each of its non-blank lines."""
    for line in work_units.unit_lines(unit):
        if line.strip():
            yield vocab.sentence_key(line.decode("utf-8"))


def _units(pipeline, files: list[str], scratch: str):
    """The corpus's units, cut on the workers. They need no numbering (``work_units.stitch``):
    the counts add up and the sample is order-free."""
    return (
        pipeline
        | "Spans" >> beam.Create(work_units.spans(files, UNIT_BYTES))
        | "SpreadSpans" >> beam.Reshuffle()
        | "Cut" >> beam.FlatMap(work_units.cut_span, UNIT_BYTES, scratch)
        | "SpreadUnits" >> beam.Reshuffle()
    )


def _learner_words(counts, reserved: list[str]):
    """``(word, count)`` -> the words ``vocab.LearnerInput`` holds (module docstring)."""
    single = beam.pvalue.AsSingleton
    inputs = counts | "InputWords" >> beam.Filter(
        lambda pair: vocab.is_input_word(pair[0], reserved)
    )
    alphabet = (
        inputs
        | "Chars" >> beam.FlatMap(lambda pair: vocab.char_counts(*pair))
        | "SumChars" >> beam.CombinePerKey(sum)
        | "AllChars" >> beam.combiners.ToDict()
        | "Alphabet" >> beam.Map(vocab.allowed_chars)
    )
    usable = inputs | "Usable" >> beam.Filter(
        lambda pair, allowed: vocab.is_usable(pair[0], allowed), single(alphabet)
    )
    cut = (
        usable
        | "ByCount" >> beam.Map(lambda pair: (pair[1], 1))
        | "WordsPerCount" >> beam.CombinePerKey(sum)
        | "AllCounts" >> beam.combiners.ToDict()
        | "InputCut" >> beam.Map(vocab.input_cut)
    )
    above = (
        usable
        | "Above" >> beam.Filter(lambda pair, cut: pair[1] > cut.count, single(cut))
        | "AllAbove" >> beam.combiners.ToList()
    )
    ties = (
        usable
        | "Ties" >> beam.Filter(lambda pair, cut: pair[1] == cut.count, single(cut))
        | "TiedWords" >> beam.Keys()
        | "FirstTies" >> beam.combiners.Top.Smallest(vocab.MAX_INPUT_TOKENS)
        | "CutTies" >> beam.Map(lambda words, cut: words[: cut.ties], single(cut))
    )
    return above, ties, cut


def learner_input(
    files: list[str],
    do_lower_case: bool,
    num_unused: int,
    output_file: str,
    runner: str,
    pipeline_options: str,
) -> vocab.LearnerInput:
    """``vocab.learner_input`` of the corpus's word counts, computed on Beam's workers (scratch
    beside ``output_file``)."""
    reserved = vocab.reserved_tokens(num_unused)
    with beam_pipeline.scratch_beside(output_file) as scratch:

        def build(pipeline):
            counts = (
                _units(pipeline, files, scratch)
                | "CountWords" >> beam.ParDo(_CountWords(do_lower_case))
                | "Sum" >> beam.CombinePerKey(sum)
            )
            bounds = counts | "Counts" >> beam.Values() | "Range" >> beam.CombineGlobally(_Range())
            above, ties, cut = _learner_words(counts, reserved)
            single = beam.pvalue.AsSingleton
            _ = above | "Write" >> beam.Map(
                lambda words, ties, cut, bounds: beam_pipeline.write_result(
                    dict(words=words, ties=ties, tie_count=cut.count, bounds=bounds), scratch
                ),
                single(ties), single(cut), single(bounds),
            )  # fmt: skip

        beam_pipeline.run(runner, pipeline_options, build)
        result = beam_pipeline.read_result(scratch)
    words = [(word, count) for word, count in result["words"]]
    words += [(word, result["tie_count"]) for word in result["ties"]]
    return vocab.LearnerInput(words, *result["bounds"])


def sample_sentences(
    files: list[str], output_file: str, runner: str, pipeline_options: str
) -> list[str]:
    """``vocab.sample_sentences`` of the corpus on Beam's workers."""
    with beam_pipeline.scratch_beside(output_file) as scratch:

        def build(pipeline):
            _ = (
                _units(pipeline, files, scratch)
                | "Sentences" >> beam.FlatMap(_keyed_sentences)
                | "Sample" >> beam.combiners.Top.Smallest(vocab.SENTENCE_SAMPLE)
                | "Write"
                >> beam.Map(lambda sample: beam_pipeline.write_result(sorted(sample), scratch))
            )

        beam_pipeline.run(runner, pipeline_options, build)
        sample = beam_pipeline.read_result(scratch)
    return [sentence for _, sentence in sample]
