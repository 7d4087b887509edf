"""The offline builder on Apache Beam: ``create_pretraining_data --runner=<a Beam runner>``.

The same computation as ``bertjax.data.offline`` (read that first), with Beam's workers in place
of the local process pool, and the same bytes out: the work unit stays the unit of parallelism
and ``offline.write_unit`` makes each unit's records, so only who runs a unit and who appends
the shards change.

    spans (work_units.spans: from file sizes, nothing read here)
      | Create | Reshuffle | Map(_cut)      work_units.cut_span in a worker: the span's units (a
                                            .gz file's as plain pieces in the scratch)
      | ToList | FlatMap(_stitched)         work_units.stitch: every unit, numbered in order
      | Reshuffle                           spread over the workers
      | ParDo(_WriteUnit)                   offline.write_unit: <scratch>/unit-U-shard-S files;
                                            yields the unit's stats (bertjax.data.stats)
      | CombineGlobally(_Merge)             every unit done: the run's statistics
    shards | ParDo(_Concatenate, total)     per output shard, its units' scratch files appended in
                                            unit order (the side input makes it wait for all)
    total | Map(write_result)               <scratch>/result.json: the summary this process prints

Beam's file sinks do not keep order; here record ``j`` of unit ``u`` goes to shard
``(u + j) % num_shards`` inside ``write_unit`` and ``_Concatenate`` orders a shard by unit, so the
output is byte-identical to ``--runner=local`` on any runner and any number of workers (tested
on DirectRunner with two worker processes). Each shard lands atomically (``bertjax.atomic``).

The scratch directory sits beside the first output (``beam_pipeline.scratch_beside``): local for
the local runners, ``gs://`` for Dataflow, where every worker can reach it; it is removed at the
end. Runners and Beam's own options: ``bertjax.data.beam_pipeline``.
"""

from __future__ import annotations

import apache_beam as beam  # the command has called beam_pipeline.require

from bertjax import atomic
from bertjax.data import beam_pipeline, offline, sources, work_units
from bertjax.data.instances import DataError


class _WriteUnit(beam.DoFn):
    """One unit -> its scratch files (``offline.write_unit``) and its statistics."""

    def __init__(self, job: offline.Job):
        self.job = job

    def setup(self):
        offline._init_worker(self.job)  # once per worker process: tokenizer, masking spec

    def process(self, unit):
        yield offline.write_unit(unit)


def _merge(accumulators):
    total = None
    for accumulator in accumulators:
        total = accumulator if total is None else total.merge(accumulator)
    return total


def _concatenate(shard: int, total, paths: list[str], scratch: str) -> int:
    """Output shard ``shard``: its units' scratch files in unit order; returns bytes written."""
    del total  # the side input only orders this after every unit
    gfile, written = beam_pipeline.gfile(), 0
    # One listing, not an existence check per unit (a request each on gs://).
    pieces = sorted(gfile.glob(offline.unit_shard_pattern(scratch, shard)), key=offline.unit_of)
    with atomic.writer(paths[shard], "wb") as output:
        for path in pieces:
            with gfile.GFile(path, "rb") as f:
                while chunk := f.read(1 << 22):
                    output.write(chunk)
                    written += len(chunk)
    return written


def _write_summary(total, scratch: str) -> None:
    beam_pipeline.write_result(total.summary(), scratch)


def _cut(span: work_units.Span, job: offline.Job) -> tuple[int, list]:
    return span.index, work_units.cut_span(span, job.unit_bytes, split_dir=job.scratch_dir)


def _stitched(cut_spans: list[tuple[int, list]], files: list[str]) -> list:
    units = work_units.stitch(units for _, units in sorted(cut_spans, key=lambda cut: cut[0]))
    if not units:
        raise DataError(f"data.input_files {files}: no documents (empty input)")
    return units


def write_tfrecords(
    data_config, paths, seed, shuffle_buffer, *, unit_bytes, runner, pipeline_options=""
) -> dict:
    """``offline.write_tfrecords`` on the Beam ``runner``; returns the statistics' summary."""
    files = sources.resolve_files(data_config.input_files, "input_files")
    spans = work_units.spans(files, unit_bytes)  # file sizes only: the workers read
    with beam_pipeline.scratch_beside(paths[0]) as scratch:
        job = offline.Job(
            data_config.to_dict(), seed, shuffle_buffer, len(paths), scratch, unit_bytes
        )

        def build(pipeline):
            units = (
                pipeline
                | "Spans" >> beam.Create(spans)
                | "SpreadSpans" >> beam.Reshuffle()
                | "Cut" >> beam.Map(_cut, job)
                | "AllCut" >> beam.combiners.ToList()
                | "Stitch" >> beam.FlatMap(_stitched, files)
                | "SpreadUnits" >> beam.Reshuffle()
            )
            total = (
                units
                | "WriteUnits" >> beam.ParDo(_WriteUnit(job))
                | "Merge" >> beam.CombineGlobally(_merge)
            )
            _ = (
                pipeline
                | "Shards" >> beam.Create(range(len(paths)))
                | "Concatenate" >> beam.Map(
                    _concatenate, beam.pvalue.AsSingleton(total), paths, scratch
                )
            )  # fmt: skip
            _ = total | "Summary" >> beam.Map(_write_summary, scratch)

        beam_pipeline.run(runner, pipeline_options, build)
        return beam_pipeline.read_result(scratch)
