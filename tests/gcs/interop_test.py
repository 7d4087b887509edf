"""``bertjax.interop`` and the commands over it with every path on gs://, against the same reads
and commands on local copies (which tests/interop and tests/commands check against transformers
and Google's original code):

1. every format ``formats.load`` reads (a HF directory with ``model.safetensors`` or
   ``pytorch_model.bin``, Google's TF1 release as a directory and as a checkpoint prefix, a
   bertjax params-only checkpoint) gives from gs:// what it gives from disk: the same format
   detected, params equal bit for bit, the same config, casing, task and vocab, its vocab read
   from gs://; bad input on gs:// is the one-line error that names the gs:// file;
2. ``convert`` both ways with ``--src`` and ``--dst`` on gs://: the HF directory written on gs://
   is, byte for byte, the one the same conversion writes on disk, and converting it back gives
   the original params (1);
3. ``extract_features`` with ``--checkpoint``, ``--input_file`` and ``--output_file`` on gs://
   writes the lines it writes from local files.
"""

import hashlib
import json
import shutil
import sys

import pytest

from tests.gcs.conftest import DATA_BUCKET, FLAT_PARAMS, REPO, upload, upload_tree

pytestmark = pytest.mark.xdist_group("gcs")
OUT = f"gs://{DATA_BUCKET}/interop"

SAME_READS = (
    """
import json, sys
import bertjax  # first: its start-up settings (bertjax.startup) precede TensorFlow's
import numpy as np
from etils import epath
from bertjax.interop import formats
from bertjax.interop.converted import ConvertError
"""
    + FLAT_PARAMS
    + """
def differ(a, b):
    a, b = dict(flat(a)), dict(flat(b))
    return sorted(k for k in a.keys() | b.keys() if k not in a or k not in b
                  or a[k].dtype != b[k].dtype or not np.array_equal(a[k], b[k]))

reads = {}
for local, remote, kwargs in json.loads(sys.argv[1]):
    mine, theirs = formats.load(local, **kwargs), formats.load(remote, **kwargs)
    vocab = lambda conv: epath.Path(conv.vocab_file).read_bytes()
    reads[remote] = {
        "formats": [formats.detect_format(local), formats.detect_format(remote)],
        "differ": differ(mine.params, theirs.params), "leaves": len(list(flat(theirs.params))),
        "same_config": mine.config == theirs.config,
        "casing": [mine.do_lower_case, theirs.do_lower_case], "task": [mine.task, theirs.task],
        "same_vocab": vocab(mine) == vocab(theirs), "vocab_file": theirs.vocab_file,
    }
errors = {}
for path in sys.argv[2:]:
    try:
        formats.load(path)
    except ConvertError as e:
        errors[path] = str(e)
print(json.dumps({"reads": reads, "errors": errors}))
"""
)

OBJECTS = """
import hashlib, json, sys
from google.cloud import storage
bucket, prefix = sys.argv[1][5:].split("/", 1)
print(json.dumps({b.name[len(prefix):]: hashlib.sha256(b.download_as_bytes()).hexdigest()
                  for b in storage.Client().list_blobs(bucket, prefix=prefix)}))
"""

DOWNLOAD = """
import sys
from google.cloud import storage
bucket, name = sys.argv[1][5:].split("/", 1)
sys.stdout.write(storage.Client().bucket(bucket).blob(name).download_as_text())
"""


def _command(gcs, module: str, *flags) -> str:
    result = gcs.run([sys.executable, "-m", f"bertjax.{module}", *flags], cwd=REPO)
    assert result.returncode == 0, result.stderr.strip().splitlines()[-1:]
    return result.stdout


@pytest.fixture(scope="module")
def converted(gcs, gcs_data):
    """``convert`` gs:// -> gs://, both ways: the tiny params to HF, and that HF directory back."""
    out = _command(gcs, "convert", f"--src={gcs_data.params}", f"--dst={OUT}/hf", "--to=hf")
    assert out == f"wrote hf checkpoint to {OUT}/hf\n"
    out = _command(gcs, "convert", f"--src={OUT}/hf", f"--dst={OUT}/back", "--to=bertjax")
    assert out == f"wrote bertjax checkpoint to {OUT}/back\n"
    return f"{OUT}/hf", f"{OUT}/back"


def test_convert_to_hf_on_gs_writes_what_it_writes_on_disk(gcs, gcs_hf, converted):
    on_gcs = json.loads(gcs.python(OBJECTS, converted[0] + "/"))
    on_disk = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in gcs_hf.local.iterdir()}
    assert on_gcs == on_disk  # no temporary object left either
    assert sorted(on_gcs) == ["config.json", "model.safetensors", "tokenizer_config.json",
                              "vocab.txt"]  # fmt: skip


def _local_formats(directory):
    """The small HF model (tests/interop) as every format on disk, and two broken HF dirs."""
    from tests.interop import references
    from tests.interop.tf1_test import write_tf1_checkpoint

    model = references.random_pretraining(1, **references.SMALL)
    references.hf_dir(model, directory / "safetensors")
    model.save_pretrained(directory / "bin", safe_serialization=False)  # pytorch_model.bin
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copyfile(directory / "safetensors" / name, directory / "bin" / name)
    (directory / "tf1").mkdir()
    write_tf1_checkpoint(model, directory / "tf1")
    shutil.copytree(directory / "safetensors", directory / "corrupt")
    (directory / "corrupt/model.safetensors").write_bytes(b"not a safetensors file")
    shutil.copytree(directory / "safetensors", directory / "novocab")
    (directory / "novocab/vocab.txt").unlink()


def test_every_format_reads_the_same_from_gs_as_from_disk(gcs, gcs_data, gcs_hf, converted,
                                                          tmp_path):  # fmt: skip
    _local_formats(tmp_path)
    remote = f"{OUT}/formats"
    upload_tree(gcs, tmp_path, remote)
    tf1 = {"do_lower_case": True}  # the release does not record its casing
    cases = {  # gs:// path -> (local path, load's arguments, the format)
        f"{remote}/safetensors": (tmp_path / "safetensors", {}, "hf"),
        f"{remote}/bin": (tmp_path / "bin", {}, "hf"),
        f"{remote}/tf1": (tmp_path / "tf1", tf1, "tf1"),
        f"{remote}/tf1/bert_model.ckpt": (tmp_path / "tf1/bert_model.ckpt", tf1, "tf1"),
        gcs_data.params: (gcs_hf.local_params, {}, "bertjax"),
        converted[1]: (gcs_hf.local_params, {}, "bertjax"),  # convert's HF -> bertjax on gs://
    }
    errors = [f"{remote}/missing", f"{remote}/corrupt", f"{remote}/novocab"]
    argument = json.dumps([(str(local), path, kwargs) for path, (local, kwargs, _) in
                           cases.items()])  # fmt: skip
    found = json.loads(gcs.python(SAME_READS, argument, *errors, cwd=REPO))
    for path, (_, _, fmt) in cases.items():
        read = found["reads"][path]
        assert read["formats"] == [fmt, fmt], path
        assert read["differ"] == [] and read["leaves"] > 30, (path, read["differ"])
        assert read["same_config"] and read["same_vocab"], path
        assert read["casing"][0] == read["casing"][1] and read["task"] == [None, None], path
        assert read["vocab_file"].startswith(path.removesuffix("/bert_model.ckpt") + "/"), path
    errors = found["errors"]
    assert errors[f"{remote}/missing"] == f"{remote}/missing: no such checkpoint directory"
    assert errors[f"{remote}/corrupt"].startswith(
        f"{remote}/corrupt/model.safetensors: unreadable weights file (SafetensorError: "
    )
    assert errors[f"{remote}/novocab"] == f"{remote}/novocab/vocab.txt: vocab file not found"


def test_extract_features_on_gs_writes_what_it_writes_from_local_files(gcs, gcs_hf, converted,
                                                                       tmp_path):  # fmt: skip
    from bertjax.finetune import features as extract_features

    text = tmp_path / "input.txt"
    text.write_text("in the beginning\nand the earth ||| was without form\n\n")
    upload(gcs, {text: f"{OUT}/input.txt"})
    out = _command(gcs, "extract_features", f"--input_file={OUT}/input.txt",
                   f"--output_file={OUT}/features.jsonl", f"--checkpoint={converted[1]}",
                   "--max_seq_length=16", "--layers=-1,-2")  # fmt: skip
    assert out == f"wrote features of 3 lines to {OUT}/features.jsonl\n"
    # The same from the original params on disk (the tiny model has 2 layers).
    extract_features.extract(str(gcs_hf.local_params), str(text),
                             str(tmp_path / "features.jsonl"), [-1, -2], 16)  # fmt: skip
    remote = gcs.python(DOWNLOAD, f"{OUT}/features.jsonl")
    assert remote == (tmp_path / "features.jsonl").read_text() and remote.count("\n") == 3
