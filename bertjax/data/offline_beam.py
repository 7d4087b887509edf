"""The offline builder on Apache Beam: ``create_pretraining_data --runner=<a Beam runner>``.

The same computation as ``bertjax.data.offline`` (read that first), with Beam's workers in place
of the local process pool, and the same bytes out: the work unit stays the unit of parallelism
and ``offline.write_unit`` makes each unit's records, so only who runs a unit and who appends
the shards change.

    units (cut here, one pass over the corpus without tokenizing, as the local builder does;
           a .gz input's units are written to the scratch as plain pieces in the same pass)
      | Create | Reshuffle                  spread over the workers
      | ParDo(_WriteUnit)                   offline.write_unit: <scratch>/unit-U-shard-S files;
                                            yields the unit's stats (bertjax.data.stats)
      | CombineGlobally(_Merge)             every unit done: the run's statistics
    shards | ParDo(_Concatenate, total)     per output shard, its units' scratch files appended in
                                            unit order (the side input makes it wait for all)
    total | Map(_write_summary)             <scratch>/summary.json, which this process prints

Beam's file sinks do not keep order; here record ``j`` of unit ``u`` goes to shard
``(u + j) % num_shards`` inside ``write_unit`` and ``_Concatenate`` orders a shard by unit, so the
output is byte-identical to ``--runner=local`` on any runner and any number of workers (tested
on DirectRunner with two worker processes). Each shard lands atomically (``bertjax.atomic``).

The scratch directory sits beside the first output (``<output>.beam-scratch-<random>``): local
for the local runners, ``gs://`` for Dataflow, where every worker can reach it; it is removed at
the end. Beam's own pipeline options pass through ``--beam_pipeline_options`` (e.g.
``'--project=P --region=R --temp_location=gs://B/tmp'``, or ``'--direct_num_workers=2
--direct_running_mode=multi_processing'`` locally).
"""

from __future__ import annotations

import json
import shlex
import uuid

from bertjax import atomic
from bertjax.data import offline, sources
from bertjax.data.instances import DataError

INSTALL = "pip install 'bertjax[beam]'"

try:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
except ImportError:  # the command's one line (it imports this module only for a Beam runner)
    raise DataError(f"--runner needs Apache Beam, which is not installed: {INSTALL}") from None


def _gfile():
    from bertjax import startup

    return startup.import_tensorflow().io.gfile


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


def _concatenate(shard: int, total, paths: list[str], scratch: str, num_units: int) -> int:
    """Output shard ``shard``: its units' scratch files in unit order; returns bytes written."""
    del total  # the side input only orders this after every unit
    gfile, written = _gfile(), 0
    with atomic.writer(paths[shard], "wb") as output:
        for unit in range(num_units):
            path = offline.unit_shard_path(scratch, unit, shard)
            if gfile.exists(path):
                with gfile.GFile(path, "rb") as f:
                    while chunk := f.read(1 << 22):
                        output.write(chunk)
                        written += len(chunk)
    return written


def _write_summary(total, scratch: str) -> None:
    with _gfile().GFile(f"{scratch}/summary.json", "w") as f:
        f.write(json.dumps(total.summary()))


def write_tfrecords(
    data_config, paths, seed, shuffle_buffer, *, unit_bytes, runner, pipeline_options=""
) -> dict:
    """``offline.write_tfrecords`` on the Beam ``runner``; returns the statistics' summary."""
    files = sources.resolve_files(data_config.input_files, "input_files")
    scratch = f"{paths[0]}.beam-scratch-{uuid.uuid4().hex[:12]}"
    job = offline.Job(data_config.to_dict(), seed, shuffle_buffer, len(paths), scratch)
    gfile = _gfile()
    gfile.makedirs(scratch)
    options = PipelineOptions([f"--runner={runner}", *shlex.split(pipeline_options)])
    try:
        units = sources.work_units(files, unit_bytes, split_dir=scratch)  # .gz: split here
        if not units:
            raise DataError(f"data.input_files {files}: no documents (empty input)")
        with beam.Pipeline(options=options) as pipeline:
            total = (
                pipeline
                | "Units" >> beam.Create(units)
                | "Spread" >> beam.Reshuffle()
                | "WriteUnits" >> beam.ParDo(_WriteUnit(job))
                | "Merge" >> beam.CombineGlobally(_merge)
            )
            _ = (
                pipeline
                | "Shards" >> beam.Create(range(len(paths)))
                | "Concatenate" >> beam.Map(
                    _concatenate, beam.pvalue.AsSingleton(total), paths, scratch, len(units)
                )
            )  # fmt: skip
            _ = total | "Summary" >> beam.Map(_write_summary, scratch)
        with gfile.GFile(f"{scratch}/summary.json") as f:
            return json.loads(f.read())
    finally:
        if gfile.exists(scratch):
            gfile.rmtree(scratch)
