"""The vocab builder's corpus reading on Apache Beam: ``python -m bertjax.vocab --runner=<runner>``.

What runs where:

- **Beam's workers** cut the corpus into work units (``bertjax.data.work_units``, 16 MB of text;
  a ``.gz`` input into plain pieces, as the offline builder does) and read it one unit at a time:
  for WordPiece they normalise, split and count its words (``vocab.WordCounter``, the tokenizer's
  own code) and sum the counts by word (``CombinePerKey(sum)``); for SentencePiece they draw the
  sample (``Top.Smallest`` by ``vocab.sentence_key``).
- **This process** lists the files' sizes (``work_units.spans``) and runs the learner on what
  comes back: tensorflow-text's WordPiece learner on the counts, or SentencePiece's trainer on the
  sample. Both are single-process libraries; the counts hold one entry per distinct word and the
  sample at most ``vocab.SENTENCE_SAMPLE`` lines, so this process needs memory for those.

The vocab is the one ``--runner=local`` builds, byte for byte (``bertjax.data.vocab``: the learner
sorts the counts and the sample is order-free; tested on DirectRunner with two workers).

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


def _keyed_sentences(unit):
    """A unit -> ``vocab.sentence_key`` of each of its non-blank lines."""
    for line in work_units.unit_lines(unit):
        if line.strip():
            yield vocab.sentence_key(line.decode("utf-8"))


def _write(values, scratch: str) -> None:
    beam_pipeline.write_result(sorted(values), scratch)


def _read(files: list[str], scratch: str, runner: str, pipeline_options: str, transform):
    """Runs ``spans | cut | transform | write`` -> what the workers wrote. The units need no
    numbering (``work_units.stitch``): the counts add up and the sample is order-free."""
    spans = work_units.spans(files, UNIT_BYTES)

    def build(pipeline):
        _ = (
            pipeline
            | "Spans" >> beam.Create(spans)
            | "SpreadSpans" >> beam.Reshuffle()
            | "Cut" >> beam.FlatMap(work_units.cut_span, UNIT_BYTES, scratch)
            | "SpreadUnits" >> beam.Reshuffle()
            | transform
            | "Write" >> beam.Map(_write, scratch)
        )

    beam_pipeline.run(runner, pipeline_options, build)
    return beam_pipeline.read_result(scratch)


def count_words(
    files: list[str], do_lower_case: bool, output_file: str, runner: str, pipeline_options: str
) -> dict[str, int]:
    """``vocab.count_words`` on Beam's workers (scratch beside ``output_file``)."""
    with beam_pipeline.scratch_beside(output_file) as scratch:
        transform = (
            "CountWords" >> beam.ParDo(_CountWords(do_lower_case))
            | "Sum" >> beam.CombinePerKey(sum)
            | "Collect" >> beam.combiners.ToList()
        )  # fmt: skip
        return dict(_read(files, scratch, runner, pipeline_options, transform))


def sample_sentences(
    files: list[str], output_file: str, runner: str, pipeline_options: str
) -> list[str]:
    """``vocab.sample_sentences`` of the corpus on Beam's workers."""
    with beam_pipeline.scratch_beside(output_file) as scratch:
        transform = (
            "Sentences" >> beam.FlatMap(_keyed_sentences)
            | "Sample" >> beam.combiners.Top.Smallest(vocab.SENTENCE_SAMPLE)
        )  # fmt: skip
        return [
            sentence for _, sentence in _read(files, scratch, runner, pipeline_options, transform)
        ]
