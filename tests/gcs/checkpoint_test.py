"""Checkpoints on gs:// through orbax, tensorstore and google-cloud-storage: a step sealed and
verified from the listing's crc32c and sizes (what the request log shows was read, against
google-crc32c over the objects' bytes), each kind of damage named, and a params-only checkpoint
written in place and read back.

Both are done by one process in the namespace (the ``done`` fixture: :data:`STEP`, then
:data:`PARAMS`), each test reading its part, and the requests of its part's time window.
"""

import json

import google_crc32c
import pytest

from tests.gcs.conftest import REPO

pytestmark = pytest.mark.xdist_group("gcs")
BUCKET = "bertjax-ckpt"

STEP = """  # the bucket; then PARAMS's arguments
import json, sys, time
import bertjax  # first: its start-up settings (bertjax.startup) precede TensorFlow's
import jax, numpy as np, orbax.checkpoint as ocp
from google.cloud import storage
from bertjax.training import checkpoint_manifest as cm

root = f"gs://{sys.argv[1]}/run/checkpoints"
tree = {"w": np.random.default_rng(0).standard_normal(300_000).astype(np.float32),
        "b": np.ones((3, 7), np.int32)}  # random: orbax compresses
manager = ocp.CheckpointManager(root)
sealer = cm.ManifestSealer(root, poll_s=0.1)
phases = {"save": time.time()}
manager.save(1, args=ocp.args.StandardSave(tree))
manager.wait_until_finished()
phases["seal"] = time.time()
sealer.submit(1)
sealer.close()
phases["verify"] = time.time()
cm.verify(f"{root}/1")
phases["damage"] = time.time()
bucket = storage.Client().bucket(sys.argv[1])
prefix = "run/checkpoints/1/"
blobs = {b.name[len(prefix):]: b for b in bucket.list_blobs(prefix=prefix)}
contents = {name: blob.download_as_bytes() for name, blob in blobs.items()}

def reason():
    try:
        cm.verify(f"{root}/1")
    except cm.CheckpointCorrupt as e:
        return e.reason

largest = max((n for n in contents if n != cm.MANIFEST_FILE), key=lambda n: len(contents[n]))
flipped = bytearray(contents[largest])
flipped[len(flipped) // 2] ^= 1
reasons = {}
bucket.blob(prefix + largest).upload_from_string(bytes(flipped))
reasons["flipped"] = reason()
bucket.blob(prefix + largest).upload_from_string(contents[largest])
reasons["restored"] = reason()
bucket.blob(prefix + largest).delete()
reasons["missing"] = reason()
bucket.blob(prefix + largest).upload_from_string(contents[largest])
bucket.blob(prefix + "state/stray").upload_from_string(b"x")
reasons["extra"] = reason()
step = {"phases": phases, "largest": largest, "reasons": reasons,
        "contents": {n: c.hex() for n, c in contents.items()}}
"""


def _is_object_read(request, prefix: str) -> bool:
    """A media download (JSON API ``alt=media`` or XML API) of an object under ``prefix``."""
    path = request["path"].replace("%2F", "/")
    json_api = (
        path.startswith(f"/storage/v1/b/{BUCKET}/o/{prefix}") and "alt=media" in request["query"]
    )
    return request["method"] == "GET" and (json_api or path.startswith(f"/{BUCKET}/{prefix}"))


@pytest.fixture(scope="module")
def bucket(gcs):
    gcs.create_bucket(BUCKET)
    return BUCKET


def test_a_gcs_step_is_sealed_and_verified_from_the_listing(done):
    out, requests = done[0]["step"], done[1]
    contents = {name: bytes.fromhex(data) for name, data in out["contents"].items()}
    manifest_bytes = contents.pop("bertjax_manifest.json")
    manifest = json.loads(manifest_bytes)
    assert manifest["checksum"] == "crc32c"
    expected = [
        {"path": name, "size": len(data), "checksum": f"{google_crc32c.value(data):08x}"}
        for name, data in sorted(contents.items())
        if not name.endswith("/")  # directory markers
    ]
    assert manifest["files"] == expected
    assert sum(f["size"] for f in manifest["files"]) > 1_000_000  # 1.2 MB of float32, zstd-ed
    # Nothing of the step was read to seal or verify it: a listing, and the manifest itself.
    phases = out["phases"]
    served = [r for r in requests if phases["seal"] <= r["t"] < phases["damage"]]
    reads = [r for r in served if _is_object_read(r, "run/checkpoints/1/")]
    assert [r["path"].rsplit("%2F", 1)[-1].rsplit("/", 1)[-1] for r in reads] == [
        "bertjax_manifest.json"
    ]
    assert sum(r["out"] for r in reads) == len(manifest_bytes)
    reasons = out["reasons"]
    largest = out["largest"]
    crc = lambda data: f"{google_crc32c.value(data):08x}"  # noqa: E731
    flipped = bytearray(contents[largest])
    flipped[len(flipped) // 2] ^= 1
    assert reasons == {
        "flipped": f"{largest}: checksum differs: expected crc32c {crc(contents[largest])} "
        f"got {crc(bytes(flipped))}",
        "restored": None,  # the same bytes again: a new object, the same checksum
        "missing": f"{largest}: missing",
        "extra": "state/stray: unexpected file (not in the manifest)",
    }


PARAMS = """  # the gs:// destination, a vocab; after STEP, in its process
import time
from bertjax.model.config import BertConfig
from bertjax.training import checkpoint
params = {"encoder": {"layers": {"layer_0": {"w": np.arange(6, dtype=np.float32)}}},
          "pooler": {"b": np.ones(3, np.float32)}}
config = BertConfig(vocab_size=20, hidden_size=4, num_layers=1, num_heads=1, intermediate_size=8,
                    max_position_embeddings=8)
dst, vocab, begun = sys.argv[2], sys.argv[3], time.time()
checkpoint.save_params(dst, params, config, vocab, True)
params["pooler"]["b"] = params["pooler"]["b"] * 2
checkpoint.save_params(dst, params, config, vocab, True, overwrite=True)
loaded, loaded_config, meta = checkpoint.load_params(dst)
print(json.dumps({"step": step, "params": {
    "begun": begun, "b": loaded["pooler"]["b"].tolist(),
    "w": loaded["encoder"]["layers"]["layer_0"]["w"].tolist(),
    "vocab": meta["vocab"]["entries"], "layers": loaded_config.num_layers}}))
"""


@pytest.fixture(scope="module")
def done(gcs, bucket, gcs_data):
    """STEP then PARAMS, in one process: their outputs, and the requests served meanwhile."""
    mark = gcs.mark()
    out = json.loads(gcs.python(STEP + PARAMS, bucket, f"gs://{BUCKET}/params", gcs_data.vocab,
                                cwd=REPO))  # fmt: skip
    return out, gcs.requests(mark)


def test_a_params_checkpoint_is_written_in_place_and_read_back(done):
    out, requests = dict(done[0]["params"]), done[1]
    begun = out.pop("begun")
    assert out == {"b": [2.0, 2.0, 2.0], "w": [0, 1, 2, 3, 4, 5], "vocab": 7633, "layers": 1}
    # Never renamed: no object was copied (rewriteTo) and nothing written under another name.
    served = [r for r in requests if r["t"] >= begun]
    assert not [r for r in served if "rewriteTo" in r["path"] or ".tmp-" in r["query"]]
