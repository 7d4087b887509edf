"""Fixtures of the GCS tests: ``gcs``, one hermetic Cloud Storage per test session
(``tests/gcs/emulator.py``); ``gcs_data``, a corpus, its vocab, its pretraining TFRecords and
a tiny model's params-only checkpoint on it; ``gcs_hf``, that checkpoint as a HF directory on
it, with local copies of both.

Every test here uses ``gcs``, skipped with a one-line reason where the namespace cannot be made
(not root, or ``unshare`` refused). Each module marks itself ``xdist_group("gcs")``: one
pytest-xdist worker, one namespace.
"""

import dataclasses
import gzip
import pathlib
import sys

import pytest

from bertjax.data import bundled
from tests.gcs.emulator import Emulator, Unavailable
from tests.pretrain.step_test import TINY_MODEL

REPO = pathlib.Path(__file__).parents[2]
DATA_BUCKET = "bertjax-data"
# For the scripts run in the namespace: a params tree as ("a/b/kernel", array) pairs (needs np).
FLAT_PARAMS = """
def flat(tree, prefix=""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from flat(value, f"{prefix}{key}/")
        else:
            yield prefix + key, np.asarray(value)
"""
# ``python -m MODULE ARGV`` for each [MODULE, *ARGV] of argv[1] (JSON), in one process run in the
# namespace (a start-up saved per run, ``tests.commands.in_process``): absl's flags reset between
# runs, each run the module as ``__main__``; its exit status, what it wrote to file descriptors 1
# and 2 (C++ logs too) and its wall seconds, as JSON lines.
COMMANDS = """
import json, os, sys, time
from tests.commands.in_process import run_module
real = os.dup(1)
for argv in json.loads(sys.argv[1]):
    started = time.monotonic()
    done = run_module(argv[0], *argv[1:], process_setup=True)
    result = {"code": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
              "seconds": time.monotonic() - started}
    os.write(real, (json.dumps(result) + "\\n").encode())
"""
# The shape of main_test's runs (tests/commands/main_test.py), which the TFRecords must match.
MAX_SEQ_LENGTH, MAX_PREDICTIONS = 32, 5


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
    try:
        emulator = Emulator.start(tmp_path_factory.mktemp("gcs"))
    except Unavailable as e:
        pytest.skip(f"no hermetic GCS here: {e}")
    emulator.create_bucket(DATA_BUCKET)
    yield emulator
    emulator.stop()


PARAMS_CHECKPOINT = """  # gs:// destination, its vocab, the model's sizes
import sys
import bertjax
import flax.linen as nn
import jax
import jax.numpy as jnp
from bertjax.model.config import BertConfig
from bertjax.model.heads import BertForPreTraining
from bertjax.training import checkpoint
config = BertConfig(vocab_size=7633, **eval(sys.argv[3]))
ids, positions = jnp.zeros((1, 8), jnp.int32), jnp.zeros((1, 2), jnp.int32)
# jitted: one compile instead of one per op (10 s -> 5.6 s); the same values as op by op
init = jax.jit(BertForPreTraining(config).init)
params = init({"params": jax.random.key(7)}, ids, ids, ids, positions)
checkpoint.save_params(sys.argv[1], nn.unbox(params["params"]), config, sys.argv[2], True)
"""


@dataclasses.dataclass(frozen=True)
class Data:
    local_corpus: pathlib.Path
    corpus: str  # gs://
    vocab: str  # gs://
    tfrecords: str  # gs:// glob of create_pretraining_data's shards
    created: str  # create_pretraining_data's stdout
    params: str  # gs:// params-only checkpoint: main_test's tiny model, freshly initialised


def upload(gcs: Emulator, pairs: dict[str, str]) -> None:
    """Local file -> gs:// object, with google-cloud-storage (inside the namespace)."""
    gcs.python(
        "import sys\nfrom google.cloud import storage\nclient = storage.Client()\n"
        "for source, target in zip(sys.argv[1::2], sys.argv[2::2]):\n"
        "    bucket, name = target[5:].split('/', 1)\n"
        "    client.bucket(bucket).blob(name).upload_from_filename(source)\n",
        *[str(x) for pair in pairs.items() for x in pair],
    )


def upload_tree(gcs: Emulator, directory: pathlib.Path, prefix: str) -> None:
    """Every file under local ``directory`` -> gs:// ``prefix``/its relative path."""
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    upload(gcs, {p: f"{prefix}/{p.relative_to(directory)}" for p in files})


DOWNLOAD_TREE = """
import os, sys
from google.cloud import storage
bucket, prefix = sys.argv[1][5:].split("/", 1)
for blob in storage.Client().list_blobs(bucket, prefix=prefix + "/"):
    target = os.path.join(sys.argv[2], blob.name[len(prefix) + 1 :])
    os.makedirs(os.path.dirname(target), exist_ok=True)
    blob.download_to_filename(target)
"""


def download_tree(gcs: Emulator, prefix: str, directory: pathlib.Path) -> pathlib.Path:
    """Every object under gs:// ``prefix``/ -> local ``directory``/its relative name."""
    gcs.python(DOWNLOAD_TREE, prefix, directory)
    return directory


@pytest.fixture(scope="session")
def gcs_data(gcs, tmp_path_factory) -> Data:
    """40 chapters of the bundled corpus (as main_test) and the bundled vocab on gs://, and
    ``create_pretraining_data``'s TFRecords of them, read from and written to gs://."""
    root = tmp_path_factory.mktemp("gcs_data")
    with gzip.open(bundled.bundled_paths().train, "rt", encoding="utf-8") as f:
        chapters = f.read().split("\n\n")[:40]
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(chapters) + "\n", encoding="utf-8")
    base = f"gs://{DATA_BUCKET}"
    upload(gcs, {corpus: f"{base}/corpus.txt", bundled.VOCAB: f"{base}/vocab.txt"})
    result = gcs.run(
        [sys.executable, "-m", "bertjax.create_pretraining_data", f"--input_file={base}/corpus.txt",
         f"--output_file={base}/tfrecords/train.tfrecord", "--num_output_shards=2",
         f"--vocab_file={base}/vocab.txt", f"--max_seq_length={MAX_SEQ_LENGTH}",
         f"--max_predictions_per_seq={MAX_PREDICTIONS}", "--dupe_factor=2", "--num_workers=1"],
        cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    gcs.python(PARAMS_CHECKPOINT, f"{base}/params", f"{base}/vocab.txt", repr(TINY_MODEL), cwd=REPO)
    return Data(corpus, f"{base}/corpus.txt", f"{base}/vocab.txt",
                f"{base}/tfrecords/train.tfrecord-*", result.stdout, f"{base}/params")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class HfCheckpoint:
    path: str  # gs://: gcs_data's params as a HF BertForPreTraining directory
    local: pathlib.Path  # the same directory on disk
    local_params: pathlib.Path  # gcs_data.params on disk


@pytest.fixture(scope="session")
def gcs_hf(gcs, gcs_data, tmp_path_factory) -> HfCheckpoint:
    """``gcs_data.params`` downloaded, converted to HF on disk (bertjax.interop, whose HF export is
    checked against transformers in tests/interop) and uploaded."""
    from bertjax.interop import formats  # noqa: PLC0415 - JAX and orbax: only when needed

    root = tmp_path_factory.mktemp("gcs_hf")
    params = download_tree(gcs, gcs_data.params, root / "params")
    formats.convert(str(params), str(root / "hf"), "hf")
    upload_tree(gcs, root / "hf", f"gs://{DATA_BUCKET}/hf")
    return HfCheckpoint(f"gs://{DATA_BUCKET}/hf", root / "hf", params)
