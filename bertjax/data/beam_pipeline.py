"""What the data builders share when they run on Apache Beam (``offline_beam``, ``vocab_beam``).

- ``--runner``: ``local`` (this machine's processes, no Beam) or one of :data:`RUNNERS`, checked
  by :func:`check_runner` before anything is read. A command calls :func:`require` before it
  imports a Beam builder, so without the ``beam`` extra a Beam runner name is the one-line
  :data:`INSTALL` error.
- ``--beam_pipeline_options``: Beam's own options, passed through whole, e.g.
  ``'--project=P --region=R --temp_location=gs://B/tmp'`` for Dataflow or
  ``'--direct_num_workers=2 --direct_running_mode=multi_processing'`` locally; on the command
  line they may also follow ``--`` (``bertjax.cli``).
- The scratch directory (:func:`scratch_beside`): ``<output>.beam-scratch-<random>``, beside the
  output, so that every worker can reach it (local for the local runners, ``gs://`` for
  Dataflow); a builder's pieces of input, per-unit files and its result (:func:`write_result`,
  read back by the launching process) live there, and it is removed at the end, failed or not.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
import uuid
from collections.abc import Callable, Iterator

from bertjax.data.instances import DataError

RUNNERS = ("DirectRunner", "PrismRunner", "DataflowRunner", "FlinkRunner", "SparkRunner")
INSTALL = "pip install 'bertjax[beam]'"
RUNNER_HELP = f"local (this machine's processes) or a Beam runner: {', '.join(RUNNERS)}"
OPTIONS_HELP = (
    "Beam's own options for a Beam --runner, e.g. '--project=P --region=R "
    "--temp_location=gs://B/tmp' or '--direct_num_workers=2' (or give them after --)."
)


def check_runner(runner: str, pipeline_options: str) -> None:
    """DataError for an unknown runner, or Beam options without a Beam runner."""
    if runner != "local" and runner not in RUNNERS:
        raise DataError(f"--runner={runner!r}: expected 'local' or a Beam runner {RUNNERS}")
    if runner == "local" and pipeline_options:
        raise DataError("--beam_pipeline_options: only for a Beam --runner, not 'local'")
    try:
        shlex.split(pipeline_options)
    except ValueError as e:
        raise DataError(f"--beam_pipeline_options={pipeline_options!r}: {e}") from None


def gfile():
    """``tf.io.gfile``: the builders' one file system for local and ``gs://`` scratch paths."""
    from bertjax import startup

    return startup.import_tensorflow().io.gfile


def require(runner: str):
    """``apache_beam``, or the one-line DataError that says how to install it."""
    try:
        import apache_beam
    except ImportError:
        raise DataError(f"--runner={runner} needs Apache Beam, not installed: {INSTALL}") from None
    return apache_beam


def _not_an_input_error(record: logging.LogRecord) -> bool:
    """Beam logs a worker's exception with its traceback before it raises it here; an input
    error (DataError) is the command's one line, so its record is dropped."""
    return not (record.exc_info and isinstance(record.exc_info[1], DataError))


def _raised_in(error: BaseException, path: str) -> bool:
    """Whether ``error`` was raised in a module whose file path contains ``path``."""
    traceback = error.__traceback__
    while traceback is not None and traceback.tb_next is not None:
        traceback = traceback.tb_next
    return traceback is not None and path in traceback.tb_frame.f_code.co_filename


def run(runner: str, pipeline_options: str, build: Callable) -> None:
    """Builds (``build(pipeline)``) and runs a pipeline on ``runner``, waiting for it.

    A DataError raised in a worker reaches the command as itself, without the step name Beam
    appends (``... [while running 'CountWords']``); a runner that cannot start (Beam's own
    RuntimeError or ValueError, such as Prism's binary out of reach) is one DataError line."""
    beam = require(runner)
    from apache_beam.options.pipeline_options import PipelineOptions

    options = PipelineOptions([f"--runner={runner}", *shlex.split(pipeline_options)])
    handlers = logging.getLogger().handlers
    for handler in handlers:
        handler.addFilter(_not_an_input_error)
    try:
        with beam.Pipeline(options=options) as pipeline:
            build(pipeline)
    except DataError as e:
        raise DataError(str(e).split(" [while running")[0]) from None
    except (RuntimeError, ValueError) as e:
        if not _raised_in(e, "apache_beam/runners/portability/"):
            raise
        # The runner itself could not start (e.g. Prism's binary cannot be fetched): the
        # machine's problem, not a bug, so one line.
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DataError(f"--runner={runner} could not start: {reason}") from None
    finally:
        for handler in handlers:
            handler.removeFilter(_not_an_input_error)


@contextlib.contextmanager
def scratch_beside(path: str) -> Iterator[str]:
    """A fresh scratch directory beside ``path``, removed when the block ends."""
    directory = f"{path}.beam-scratch-{uuid.uuid4().hex[:12]}"
    files = gfile()
    files.makedirs(directory)
    try:
        yield directory
    finally:
        if files.exists(directory):
            files.rmtree(directory)


def write_result(value, scratch: str) -> None:
    """Called in a worker: ``value`` (JSON) for the launching process, ``<scratch>/result.json``."""
    with gfile().GFile(f"{scratch}/result.json", "w") as f:
        f.write(json.dumps(value))


def read_result(scratch: str):
    """What ``write_result`` wrote."""
    with gfile().GFile(f"{scratch}/result.json") as f:
        return json.loads(f.read())
