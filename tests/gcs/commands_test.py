"""The data commands with every path on gs://, against the same command on local files.

``create_pretraining_data`` (text corpus and vocab on gs:// -> TFRecords on gs://; the
``gcs_data`` fixture runs it; and on Beam's DirectRunner from a gzip'd corpus), ``data_stats`` on
those TFRecords and on the online pipeline over the gs:// corpus, and ``vocab`` (corpus ->
vocab.txt on gs://, locally and on Beam): each output must equal, byte for byte, what the command
writes or prints with local paths (run here, in-process).
"""

import contextlib
import gzip
import hashlib
import importlib
import io
import json
import sys

import pytest
from absl import flags

from bertjax import cli
from bertjax.data import bundled
from tests.data.offline_beam_test import NO_PRISM
from tests.gcs.conftest import DATA_BUCKET, MAX_PREDICTIONS, MAX_SEQ_LENGTH, REPO, upload

pytestmark = pytest.mark.xdist_group("gcs")
SHAPE = [f"--max_seq_length={MAX_SEQ_LENGTH}", f"--max_predictions_per_seq={MAX_PREDICTIONS}"]


def _on_gcs(gcs, module: str, *argv) -> str:
    """``python -m bertjax.<module> argv`` inside the namespace -> its stdout."""
    result = gcs.run([sys.executable, "-m", f"bertjax.{module}", *argv], cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


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


def _objects(gcs, prefix: str) -> dict[str, str]:
    """name (after ``prefix``) -> sha256 of every object under gs:// ``prefix``."""
    code = (
        "import hashlib, json, sys\nfrom google.cloud import storage\n"
        "bucket, prefix = sys.argv[1][5:].split('/', 1)\n"
        "print(json.dumps({b.name[len(prefix):]: hashlib.sha256(b.download_as_bytes()).hexdigest()"
        " for b in storage.Client().list_blobs(bucket, prefix=prefix)}))\n"
    )
    return json.loads(gcs.python(code, prefix))


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


def test_create_pretraining_data_reads_and_writes_gs(gcs, gcs_data, local_records):
    on_gcs = _objects(gcs, gcs_data.tfrecords.rsplit("/", 1)[0] + "/")
    assert on_gcs == _files(local_records)  # the same shards, and no temporary object left
    assert sorted(on_gcs) == [f"train.tfrecord-0000{i}-of-00002" for i in range(2)]
    assert f"wrote 2 file(s): {gcs_data.tfrecords[:-1]}00000-of-00002, " in gcs_data.created
    assert not (REPO / "gs:").exists()  # no local directory named after the bucket


def test_create_pretraining_data_on_beam_reads_and_writes_gs(
    gcs, gcs_data, local_records, tmp_path
):
    """--runner=DirectRunner from a gzip'd gs:// corpus (split into plain pieces in a gs://
    scratch) to gs:// shards: the local builder's bytes (the corpus is smaller than a span at the
    default --work_unit_bytes, so the plain and gzip'd files make the same units), and no scratch
    object left behind."""
    assert gcs_data.local_corpus.stat().st_size < 1 << 20  # one span at the default 1 MiB units
    gzipped = tmp_path / "corpus.txt.gz"
    gzipped.write_bytes(gzip.compress(gcs_data.local_corpus.read_bytes()))
    base = f"gs://{DATA_BUCKET}/beam"
    upload(gcs, {gzipped: f"{base}/in/corpus.txt.gz"})
    out = _on_gcs(gcs, "create_pretraining_data", f"--input_file={base}/in/*.gz",
                  f"--output_file={base}/out/train.tfrecord", "--num_output_shards=2",
                  f"--vocab_file={gcs_data.vocab}", *SHAPE, "--dupe_factor=2",
                  "--runner=DirectRunner", "--", NO_PRISM)  # fmt: skip
    assert out.startswith(f"Beam: --runner=DirectRunner {NO_PRISM}\n")
    assert _objects(gcs, f"{base}/out/") == _files(local_records)


def test_data_stats_on_gs_tfrecords_and_on_the_gs_corpus(gcs, gcs_data, local_records, tmp_path):
    remote = _on_gcs(gcs, "data_stats", f"--input_file={gcs_data.tfrecords}",
                     f"--vocab_file={gcs_data.vocab}", *SHAPE)  # fmt: skip
    local = _here("data_stats", f"--input_file={local_records}/*", f"--vocab_file={bundled.VOCAB}",
                  *SHAPE)  # fmt: skip
    assert remote == local and remote.startswith("examples ")
    configs = {}
    for where, corpus, vocab in (("gs", gcs_data.corpus, gcs_data.vocab),
                                 ("local", gcs_data.local_corpus, bundled.VOCAB)):  # fmt: skip
        configs[where] = tmp_path / f"{where}_config.py"
        configs[where].write_text(
            f"import sys\nsys.path.insert(0, {str(REPO / 'configs')!r})\nimport tiny\n\n\n"
            "def get_config():\n    config = tiny.get_config()\n"
            f"    config.data.input_files = config.data.eval_input_files = [{str(corpus)!r}]\n"
            f"    config.data.vocab_file = {str(vocab)!r}\n"
            f"    config.data.cache_dir = {str(tmp_path / where)!r}\n"
            "    return config\n"
        )
    remote = _on_gcs(gcs, "data_stats", f"--config={configs['gs']}", "--num_batches=3")
    local = _here("data_stats", f"--config={configs['local']}", "--num_batches=3")
    assert remote == local and remote.startswith("examples ")


def test_vocab_from_a_gs_corpus_to_gs(gcs, gcs_data, tmp_path):
    corpus = tmp_path / "corpus.txt"  # a few chapters: learning a vocab costs seconds per 100 kB
    corpus.write_text("\n\n".join(gcs_data.local_corpus.read_text().split("\n\n")[:6]))
    upload(gcs, {corpus: f"gs://{DATA_BUCKET}/small/corpus.txt"})
    flags_ = ["--vocab_size=200", "--num_unused=2"]
    _on_gcs(gcs, "vocab", f"--input_file=gs://{DATA_BUCKET}/small/*.txt",
            f"--output_file=gs://{DATA_BUCKET}/vocab/vocab.txt", *flags_)  # fmt: skip
    (tmp_path / "out").mkdir()
    _here("vocab", f"--input_file={corpus}", f"--output_file={tmp_path}/out/vocab.txt", *flags_)
    assert _objects(gcs, f"gs://{DATA_BUCKET}/vocab/") == _files(tmp_path / "out")
    # Counted by Beam's workers from gs://, the scratch beside the gs:// output: the same vocab.
    _on_gcs(gcs, "vocab", f"--input_file=gs://{DATA_BUCKET}/small/*.txt",
            f"--output_file=gs://{DATA_BUCKET}/vocab-beam/vocab.txt", *flags_,
            "--runner=DirectRunner", f"--beam_pipeline_options={NO_PRISM}")  # fmt: skip
    assert _objects(gcs, f"gs://{DATA_BUCKET}/vocab-beam/") == _files(tmp_path / "out")


DAMAGED_RUN = """  # how ('delete' | 'truncate'), then the command's flags
import sys
from bertjax import create_pretraining_data, startup
from bertjax.data import shard_pieces

tf = startup.import_tensorflow()  # without its start-up lines, as the command does

how, check = sys.argv[1], shard_pieces.check


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


shard_pieces.check = damaging
sys.argv = ["create_pretraining_data", *sys.argv[2:]]
create_pretraining_data.main()
"""


@pytest.mark.parametrize("how", ["delete", "truncate"])
def test_a_lost_or_short_gs_piece_is_one_line_and_no_output(gcs, gcs_data, how):
    """On Beam from gs:// to gs://, the scratch on gs://: a piece deleted or truncated after the
    units are written is the one line naming it; no output object and no scratch object left."""
    base = f"gs://{DATA_BUCKET}/damaged-{how}"
    result = gcs.run(
        [sys.executable, "-c", DAMAGED_RUN, how, f"--input_file={gcs_data.corpus}",
         f"--output_file={base}/train.tfrecord", "--num_output_shards=2",
         f"--vocab_file={gcs_data.vocab}", *SHAPE, "--dupe_factor=2", "--runner=DirectRunner",
         f"--beam_pipeline_options={NO_PRISM}"],
        cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    _, path, size, records = result.stdout.splitlines()[-1].split()
    scratch = f"{base}/train.tfrecord-00000-of-00002.beam-scratch-"  # beside the first shard
    assert path.startswith(scratch) and "/unit-000000-shard-" in path
    shard = int(path.rsplit("/", 1)[1].split("-")[3])
    found = "missing" if how == "delete" else f"{int(size) - 10} bytes"
    # Beam's and TensorFlow's own log lines come first in a subprocess; the error is the last.
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"create_pretraining_data: error: {path}: {found}, expected {size} bytes ({records} "
        f"records) of work unit 0 for output shard {shard}; no output shard written"
    )
    assert _objects(gcs, f"{base}/") == {}
