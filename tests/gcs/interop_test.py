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

Everything on gs:// is done by one process in the namespace (:data:`PROBE`, the ``done``
fixture): the uploads, the commands (each its module run as ``__main__``, as ``python -m`` runs
it: tests/gcs/commands_test.py's :data:`SPEC_PRELUDE`), the reads (1), and the objects listed and
read back at the end. A start-up each saved on six processes.
"""

import hashlib
import json
import shutil

import pytest

from tests.gcs.commands_test import SPEC_PRELUDE
from tests.gcs.conftest import DATA_BUCKET, FLAT_PARAMS, REPO

pytestmark = pytest.mark.xdist_group("gcs")
OUT = f"gs://{DATA_BUCKET}/interop"

SAME_READS = (  # reads sys.argv[1] (JSON: [local, gs://, load's kwargs]...), errors sys.argv[2:]
    """
import json, sys
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
found = {"reads": reads, "errors": errors}
"""
)

PROBE = (
    SPEC_PRELUDE
    + """
runs = {name: run_module(module, argv) for name, module, argv in spec["runs"]}
sys.argv = [sys.argv[0], json.dumps(spec["reads"]), *spec["errors"]]
"""
    + SAME_READS
    + """
bucket, prefix = spec["listing"][5:].split("/", 1)
objects = {b.name[len(prefix):]: hashlib.sha256(b.download_as_bytes()).hexdigest()
           for b in client.list_blobs(bucket, prefix=prefix)}
bucket, name = spec["download"][5:].split("/", 1)
text = client.bucket(bucket).blob(name).download_as_text()
json.dump({"runs": runs, "found": found, "objects": objects, "features": text},
          open(results_path, "w"))
"""
)
TF1 = {"do_lower_case": True}  # the release does not record its casing


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


@pytest.fixture(scope="module")
def done(gcs, gcs_data, gcs_hf, tmp_path_factory):
    """Every gs:// part of this module in one process (:data:`PROBE`): ``convert`` gs:// ->
    gs://, both ways (the tiny params to HF, and that HF directory back), ``extract_features``
    from the converted params, the reads of every format (1): {"runs", "found", "objects" (the
    HF directory's), "features" (the lines written on gs://)}, and the local files it read."""
    root = tmp_path_factory.mktemp("interop")
    _local_formats(root / "formats")
    text = root / "input.txt"
    text.write_text("in the beginning\nand the earth ||| was without form\n\n")
    remote = f"{OUT}/formats"
    files = sorted(p for p in (root / "formats").rglob("*") if p.is_file())
    uploads = [(str(p), f"{remote}/{p.relative_to(root / 'formats')}") for p in files]
    cases = {  # gs:// path -> (local path, load's arguments, the format)
        f"{remote}/safetensors": (root / "formats/safetensors", {}, "hf"),
        f"{remote}/bin": (root / "formats/bin", {}, "hf"),
        f"{remote}/tf1": (root / "formats/tf1", TF1, "tf1"),
        f"{remote}/tf1/bert_model.ckpt": (root / "formats/tf1/bert_model.ckpt", TF1, "tf1"),
        gcs_data.params: (gcs_hf.local_params, {}, "bertjax"),
        f"{OUT}/back": (gcs_hf.local_params, {}, "bertjax"),  # convert's HF -> bertjax on gs://
    }
    spec = {
        "uploads": [*uploads, (str(text), f"{OUT}/input.txt")],
        "runs": [
            ("hf", "convert", [f"--src={gcs_data.params}", f"--dst={OUT}/hf", "--to=hf"]),
            ("back", "convert", [f"--src={OUT}/hf", f"--dst={OUT}/back", "--to=bertjax"]),
            (
                "features",
                "extract_features",
                [
                    f"--input_file={OUT}/input.txt",
                    f"--output_file={OUT}/features.jsonl",
                    f"--checkpoint={OUT}/back",
                    "--max_seq_length=16",
                    "--layers=-1,-2",
                ],
            ),
        ],  # fmt: skip
        "reads": [(str(local), path, kwargs) for path, (local, kwargs, _) in cases.items()],
        "errors": [f"{remote}/missing", f"{remote}/corrupt", f"{remote}/novocab"],
        "listing": f"{OUT}/hf/",
        "download": f"{OUT}/features.jsonl",
    }
    (root / "spec.json").write_text(json.dumps(spec))
    gcs.python(PROBE, root / "spec.json", root / "results.json", cwd=REPO)
    results = json.loads((root / "results.json").read_text())
    for name, expected in (("hf", f"wrote hf checkpoint to {OUT}/hf\n"),
                           ("back", f"wrote bertjax checkpoint to {OUT}/back\n")):  # fmt: skip
        run = results["runs"][name]
        assert run["code"] == 0, run["stderr"].strip().splitlines()[-1:]
        assert run["stdout"] == expected
    return results, cases, text


def test_convert_to_hf_on_gs_writes_what_it_writes_on_disk(gcs_hf, done):
    on_gcs = done[0]["objects"]
    on_disk = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in gcs_hf.local.iterdir()}
    assert on_gcs == on_disk  # no temporary object left either
    assert sorted(on_gcs) == ["config.json", "model.safetensors", "tokenizer_config.json",
                              "vocab.txt"]  # fmt: skip


def test_every_format_reads_the_same_from_gs_as_from_disk(done):
    results, cases, _ = done
    found, remote = results["found"], f"{OUT}/formats"
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


def test_extract_features_on_gs_writes_what_it_writes_from_local_files(gcs_hf, done, tmp_path):
    from bertjax.finetune import features as extract_features

    results, _, text = done
    run = results["runs"]["features"]
    assert run["code"] == 0, run["stderr"].strip().splitlines()[-1:]
    assert run["stdout"] == f"wrote features of 3 lines to {OUT}/features.jsonl\n"
    # The same from the original params on disk (the tiny model has 2 layers).
    extract_features.extract(str(gcs_hf.local_params), str(text),
                             str(tmp_path / "features.jsonl"), [-1, -2], 16)  # fmt: skip
    remote = results["features"]
    assert remote == (tmp_path / "features.jsonl").read_text() and remote.count("\n") == 3
