"""The data commands with every path on gs://, against the same command on local files.

``create_pretraining_data`` (text corpus and vocab on gs:// -> TFRecords on gs://; the
``gcs_data`` fixture runs it; and on Beam's DirectRunner from a gzip'd corpus), ``data_stats`` on
those TFRecords and on the online pipeline over the gs:// corpus, and ``vocab`` (corpus ->
vocab.txt on gs://, locally and on Beam): each output must equal, byte for byte, what the command
writes or prints with local paths (run here, in-process).

The gs:// runs share one process in the namespace (:data:`PROBE`, the ``runs`` fixture): each is
its command module run as ``__main__``, as ``python -m`` runs it, with absl's flags reset between
runs and its own stdout and stderr (file descriptors 1 and 2; :data:`RUN_MODULE`,
``tests.commands.in_process``); the objects are listed at the end, in the same
process. A start-up each (~7 s of imports) saved on seven runs.
"""

import contextlib
import gzip
import hashlib
import importlib
import io
import json
import pathlib

import pytest
from absl import flags

from bertjax import cli
from bertjax.data import bundled
from tests.data.offline_beam_test import NO_PRISM
from tests.gcs.conftest import DATA_BUCKET, MAX_PREDICTIONS, MAX_SEQ_LENGTH, REPO

pytestmark = pytest.mark.xdist_group("gcs")
SHAPE = [f"--max_seq_length={MAX_SEQ_LENGTH}", f"--max_predictions_per_seq={MAX_PREDICTIONS}"]


def _here(module: str, *argv) -> str:
    """The same command on local paths, in this process -> its stdout."""
    command = importlib.import_module(f"bertjax.{module}")
    values = flags.FlagValues()  # private flags: no clash with other commands in this process
    command.define_flags(values)
    values([module, *argv])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.call(command.run, values, prog=module) == 0
    return out.getvalue()


def _files(directory) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


@pytest.fixture(scope="module")
def local_records(gcs_data, tmp_path_factory):
    """create_pretraining_data on the local corpus, as ``gcs_data`` ran it on gs://."""
    directory = tmp_path_factory.mktemp("records")
    _here("create_pretraining_data", f"--input_file={gcs_data.local_corpus}",
          f"--output_file={directory}/train.tfrecord", "--num_output_shards=2",
          f"--vocab_file={bundled.VOCAB}", *SHAPE, "--dupe_factor=2",
          "--num_workers=1")  # fmt: skip
    return directory


RUN_MODULE = """
from tests.commands.in_process import run_module as _run_module


def run_module(module, argv):
    \"\"\"``python -m bertjax.<module> argv``, here -> {code, stdout, stderr}.\"\"\"
    done = _run_module(f"bertjax.{module}", *argv, process_setup=True)
    return {"code": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
"""
SPEC_PRELUDE = (  # a namespace script's start: the spec's JSON file, the results' JSON file
    """
import hashlib, json, sys
import bertjax  # first: its start-up settings (bertjax.startup) precede TensorFlow's
from bertjax import startup
from google.cloud import storage

tf = startup.import_tensorflow()  # without its start-up lines, as the commands import it
"""
    + RUN_MODULE
    + """
spec, results_path = json.load(open(sys.argv[1])), sys.argv[2]
client = storage.Client()
for source, target in spec["uploads"]:
    bucket, name = target[5:].split("/", 1)
    client.bucket(bucket).blob(name).upload_from_filename(source)
"""
)
PROBE = (
    SPEC_PRELUDE
    + """
from bertjax.data import shard_pieces
check, how = shard_pieces.check, None


def damaging(pieces):  # between the unit stage and the concatenation (tests/data/offline_test)
    if pieces and shard_pieces.check is damaging:
        path = pieces[0].path
        data = tf.io.gfile.GFile(path, "rb").read()
        print("damaged", path, len(data), sum(1 for _ in tf.data.TFRecordDataset(path)), flush=True)
        if how == "delete":
            tf.io.gfile.remove(path)
        else:
            with tf.io.gfile.GFile(path, "wb") as f:
                f.write(data[:-10])
        shard_pieces.check = check
    check(pieces)


results = []
for run in spec["runs"]:
    how = run["damage"]
    shard_pieces.check = damaging if how else check
    results.append(run_module(run["module"], run["argv"]))
objects = {}
for prefix in spec["listings"]:  # name (after the prefix) -> sha256, of every object under it
    bucket, name = prefix[5:].split("/", 1)
    objects[prefix] = {b.name[len(name):]: hashlib.sha256(b.download_as_bytes()).hexdigest()
                       for b in client.list_blobs(bucket, prefix=name)}
json.dump({"runs": results, "objects": objects}, open(results_path, "w"))
"""
)
BEAM = f"gs://{DATA_BUCKET}/beam"
SMALL = f"gs://{DATA_BUCKET}/small"
VOCAB_FLAGS = ["--vocab_size=200", "--num_unused=2"]
DAMAGES = ("delete", "truncate")


def _stats_config(path: pathlib.Path, corpus, vocab, cache: pathlib.Path) -> pathlib.Path:
    path.write_text(
        f"import sys\nsys.path.insert(0, {str(REPO / 'configs')!r})\nimport tiny\n\n\n"
        "def get_config():\n    config = tiny.get_config()\n"
        f"    config.data.input_files = config.data.eval_input_files = [{str(corpus)!r}]\n"
        f"    config.data.vocab_file = {str(vocab)!r}\n"
        f"    config.data.cache_dir = {str(cache)!r}\n"
        "    return config\n"
    )
    return path


@pytest.fixture(scope="module")
def inputs(gcs_data, tmp_path_factory):
    """The local inputs of the runs: the corpus gzip'd, a few of its chapters (learning a vocab
    costs seconds per 100 kB), and data_stats configs over the gs:// and the local corpus."""
    root = tmp_path_factory.mktemp("inputs")
    gzipped = root / "corpus.txt.gz"
    gzipped.write_bytes(gzip.compress(gcs_data.local_corpus.read_bytes()))
    small = root / "small.txt"
    small.write_text("\n\n".join(gcs_data.local_corpus.read_text().split("\n\n")[:6]))
    configs = {
        where: _stats_config(root / f"{where}_config.py", corpus, vocab, root / where)
        for where, corpus, vocab in (("gs", gcs_data.corpus, gcs_data.vocab),
                                     ("local", gcs_data.local_corpus, bundled.VOCAB))
    }  # fmt: skip
    return {"gzipped": gzipped, "small": small, "configs": configs}


@pytest.fixture(scope="module")
def runs(gcs, gcs_data, inputs, tmp_path_factory):
    """Every gs:// run of this module, in one process inside the namespace (:data:`PROBE`):
    {name: {code, stdout, stderr}}, and {gs:// prefix: {name: sha256}} listed after them."""
    records = [f"--vocab_file={gcs_data.vocab}", *SHAPE, "--dupe_factor=2"]
    small = f"--input_file={SMALL}/*.txt"
    named = {
        "beam": ("create_pretraining_data", [
            f"--input_file={BEAM}/in/*.gz", f"--output_file={BEAM}/out/train.tfrecord",
            "--num_output_shards=2", *records, "--runner=DirectRunner", "--", NO_PRISM]),
        "stats_records": ("data_stats", [f"--input_file={gcs_data.tfrecords}",
                                         f"--vocab_file={gcs_data.vocab}", *SHAPE]),
        "stats_corpus": ("data_stats", [f"--config={inputs['configs']['gs']}", "--num_batches=3"]),
        "vocab": ("vocab", [small, f"--output_file=gs://{DATA_BUCKET}/vocab/vocab.txt",
                            *VOCAB_FLAGS]),
        # Counted by Beam's workers from gs://, the scratch beside the gs:// output.
        "vocab_beam": ("vocab", [small, f"--output_file=gs://{DATA_BUCKET}/vocab-beam/vocab.txt",
                                 *VOCAB_FLAGS, "--runner=DirectRunner",
                                 f"--beam_pipeline_options={NO_PRISM}"]),
        **{how: ("create_pretraining_data", [
            f"--input_file={gcs_data.corpus}",
            f"--output_file=gs://{DATA_BUCKET}/damaged-{how}/train.tfrecord",
            "--num_output_shards=2", *records, "--runner=DirectRunner",
            f"--beam_pipeline_options={NO_PRISM}"]) for how in DAMAGES},
    }  # fmt: skip
    spec = {
        "uploads": [(str(inputs["gzipped"]), f"{BEAM}/in/corpus.txt.gz"),
                    (str(inputs["small"]), f"{SMALL}/corpus.txt")],
        "runs": [{"module": module, "argv": argv, "damage": name if name in DAMAGES else None}
                 for name, (module, argv) in named.items()],
        "listings": [gcs_data.tfrecords.rsplit("/", 1)[0] + "/", f"{BEAM}/out/",
                     f"gs://{DATA_BUCKET}/vocab/", f"gs://{DATA_BUCKET}/vocab-beam/",
                     *(f"gs://{DATA_BUCKET}/damaged-{how}/" for how in DAMAGES)],
    }  # fmt: skip
    root = tmp_path_factory.mktemp("runs")
    (root / "spec.json").write_text(json.dumps(spec))
    gcs.python(PROBE, root / "spec.json", root / "results.json", cwd=REPO)
    results = json.loads((root / "results.json").read_text())
    return dict(zip(named, results["runs"], strict=True)), results["objects"]


def _ok(run) -> str:
    assert run["code"] == 0, run["stderr"][-3000:]
    return run["stdout"]


def test_create_pretraining_data_reads_and_writes_gs(gcs_data, local_records, runs):
    on_gcs = runs[1][gcs_data.tfrecords.rsplit("/", 1)[0] + "/"]
    assert on_gcs == _files(local_records)  # the same shards, and no temporary object left
    assert sorted(on_gcs) == [f"train.tfrecord-0000{i}-of-00002" for i in range(2)]
    assert f"wrote 2 file(s): {gcs_data.tfrecords[:-1]}00000-of-00002, " in gcs_data.created
    assert not (REPO / "gs:").exists()  # no local directory named after the bucket


def test_create_pretraining_data_on_beam_reads_and_writes_gs(gcs_data, local_records, runs):
    """--runner=DirectRunner from a gzip'd gs:// corpus (split into plain pieces in a gs://
    scratch) to gs:// shards: the local builder's bytes (the corpus is smaller than a span at the
    default --work_unit_bytes, so the plain and gzip'd files make the same units), and no scratch
    object left behind."""
    assert gcs_data.local_corpus.stat().st_size < 1 << 20  # one span at the default 1 MiB units
    out = _ok(runs[0]["beam"])
    assert out.startswith(f"Beam: --runner=DirectRunner {NO_PRISM}\n")
    assert runs[1][f"{BEAM}/out/"] == _files(local_records)


def test_data_stats_on_gs_tfrecords_and_on_the_gs_corpus(local_records, inputs, runs):
    remote = _ok(runs[0]["stats_records"])
    local = _here("data_stats", f"--input_file={local_records}/*", f"--vocab_file={bundled.VOCAB}",
                  *SHAPE)  # fmt: skip
    assert remote == local and remote.startswith("examples ")
    remote = _ok(runs[0]["stats_corpus"])
    local = _here("data_stats", f"--config={inputs['configs']['local']}", "--num_batches=3")
    assert remote == local and remote.startswith("examples ")


def test_vocab_from_a_gs_corpus_to_gs(inputs, runs, tmp_path):
    _ok(runs[0]["vocab"])
    _here("vocab", f"--input_file={inputs['small']}", f"--output_file={tmp_path}/vocab.txt",
          *VOCAB_FLAGS)  # fmt: skip
    assert runs[1][f"gs://{DATA_BUCKET}/vocab/"] == _files(tmp_path)
    # Counted by Beam's workers from gs://, the scratch beside the gs:// output: the same vocab.
    _ok(runs[0]["vocab_beam"])
    assert runs[1][f"gs://{DATA_BUCKET}/vocab-beam/"] == _files(tmp_path)


@pytest.mark.parametrize("how", DAMAGES)
def test_a_lost_or_short_gs_piece_is_one_line_and_no_output(runs, how):
    """On Beam from gs:// to gs://, the scratch on gs://: a piece deleted or truncated after the
    units are written is the one line naming it; no output object and no scratch object left."""
    result = runs[0][how]
    base = f"gs://{DATA_BUCKET}/damaged-{how}"
    assert result["code"] == 1, result["stderr"][-3000:]
    _, path, size, records = result["stdout"].splitlines()[-1].split()
    scratch = f"{base}/train.tfrecord-00000-of-00002.beam-scratch-"  # beside the first shard
    assert path.startswith(scratch) and "/unit-000000-shard-" in path
    shard = int(path.rsplit("/", 1)[1].split("-")[3])
    found = "missing" if how == "delete" else f"{int(size) - 10} bytes"
    # Beam's and TensorFlow's own log lines come first; the error is the last.
    assert "Traceback" not in result["stderr"]
    assert result["stderr"].splitlines()[-1] == (
        f"create_pretraining_data: error: {path}: {found}, expected {size} bytes ({records} "
        f"records) of work unit 0 for output shard {shard}; no output shard written"
    )
    assert runs[1][f"{base}/"] == {}
