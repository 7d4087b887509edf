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
      | ParDo(_WriteUnit)                   offline.write_unit: the unit's shard pieces, under
                                            its attempt's own names (bertjax.data.shard_pieces);
                                            yields its stats (bertjax.data.stats) and what each
                                            piece holds (records, bytes)
    results | Map | CombineGlobally(_merge) the run's statistics
    results | FlatMap(_shard_pieces)        (shard, piece) for every committed piece
      + (shard, None) for every shard       so that a shard without pieces is written too
      | GroupByKey | Map(_concatenate)      per output shard, after every unit: its pieces
                                            checked (exist, sizes), then appended in unit order
    total | Map(write_result)               <scratch>/result.json: the summary this process prints

Beam's file sinks do not keep order; here record ``j`` of unit ``u`` goes to shard
``(u + j) % num_shards`` inside ``write_unit`` and ``_concatenate`` orders a shard by unit, so the
output is byte-identical to ``--runner=local`` on any runner and any number of workers (tested
on DirectRunner with two worker processes). Each shard lands atomically (``bertjax.atomic``).
A retried or twice-run unit leaves pieces under other attempts' names, which no shard reads; a
committed piece that is missing or short stops the shard with one line naming it
(``bertjax.data.shard_pieces``).

The scratch directory sits beside the first output (``beam_pipeline.scratch_beside``): local for
the local runners, ``gs://`` for Dataflow, where every worker can reach it; it is removed at the
end. Runners and Beam's own options: ``bertjax.data.beam_pipeline``.
"""

from __future__ import annotations

import apache_beam as beam  # the command has called beam_pipeline.require

from bertjax import atomic
from bertjax.data import beam_pipeline, offline, shard_pieces, sources, work_units
from bertjax.data.instances import DataError


class _WriteUnit(beam.DoFn):
    """One unit -> its shard pieces (``offline.write_unit``), its statistics and what its pieces
    hold."""

    def __init__(self, job: offline.Job):
        self.job = job

    def setup(self):
        offline._init_worker(self.job)  # once per worker process: tokenizer, masking spec

    def process(self, unit):
        yield offline.write_unit(unit)  # (statistics, shard_pieces.UnitPieces)


def _merge(accumulators):
    total = None
    for accumulator in accumulators:
        total = accumulator if total is None else total.merge(accumulator)
    return total


def _shard_pieces(result, scratch: str):
    """A unit's result -> ``(shard, shard_pieces.Piece)`` for each piece it committed."""
    _, pieces = result
    return [(piece.shard, piece) for piece in pieces.pieces(scratch)]


def _concatenate(keyed, paths: list[str]) -> None:
    """Output shard ``shard``: its pieces (and a None that every shard gets, so that one without
    pieces is still written), checked, then appended in unit order."""
    shard, pieces = keyed
    pieces = sorted((p for p in pieces if p is not None), key=lambda piece: piece.unit)
    shard_pieces.check(pieces)
    with atomic.writer(paths[shard], "wb") as output:
        for piece in pieces:
            shard_pieces.append(piece, output)


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
            results = units | "WriteUnits" >> beam.ParDo(_WriteUnit(job))
            total = (
                results
                | "Statistics" >> beam.Map(lambda result: result[0])
                | "Merge" >> beam.CombineGlobally(_merge)
            )
            pieces = results | "Pieces" >> beam.FlatMap(_shard_pieces, scratch)
            every_shard = (
                pipeline
                | "Shards" >> beam.Create(range(len(paths)))
                | "EveryShard" >> beam.Map(lambda shard: (shard, None))
            )
            _ = (
                (pieces, every_shard)
                | "Together" >> beam.Flatten()
                | "ByShard" >> beam.GroupByKey()
                | "Concatenate" >> beam.Map(_concatenate, paths)
            )
            _ = total | "Summary" >> beam.Map(_write_summary, scratch)

        beam_pipeline.run(runner, pipeline_options, build)
        return beam_pipeline.read_result(scratch)
