"""The hermetic GCS fixture itself: the three clients share one store, nothing leaves the
loopback, the emulator's gaps are real and closed by the front, faults and the request log do
what they say, servers die with the test run, and a machine without namespaces gets a skip.
"""

import base64
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import google_crc32c
import pytest

from tests.gcs import front
from tests.gcs.conftest import REPO
from tests.gcs.emulator import HOSTS, Emulator

pytestmark = pytest.mark.xdist_group("gcs")

CLIENTS = """
import base64, json, socket, sys
import tensorflow as tf, tensorstore as ts
from google.cloud import storage
bucket = sys.argv[1]
tf.io.gfile.makedirs(f"gs://{bucket}/tf")
with tf.io.gfile.GFile(f"gs://{bucket}/tf/a.txt", "w") as f:
    f.write("written by TensorFlow")
tf.io.write_file(f"gs://{bucket}/tf/empty", "")  # an empty upload: Transfer-Encoding identity
kv = ts.KvStore.open({"driver": "gcs", "bucket": bucket}).result()
kv.write("ts/b.bin", b"written by tensorstore").result()
client = storage.Client()
client.bucket(bucket).blob("gcs/c.bin").upload_from_string(b"by google-cloud-storage")
try:
    socket.create_connection(("8.8.8.8", 53), timeout=2)
    outside = "reachable"
except OSError as e:
    outside = e.strerror
print(json.dumps({
    "tf_reads": tf.io.gfile.GFile(f"gs://{bucket}/ts/b.bin", "rb").read().decode(),
    "ts_reads": kv.read("gcs/c.bin").result().value.decode(),
    "gcs_reads": client.bucket(bucket).blob("tf/a.txt").download_as_bytes().decode(),
    "listing": {b.name: [b.size, b.crc32c] for b in client.list_blobs(bucket)},
    "interfaces": [name for _, name in socket.if_nameindex()],
    "hosts": {h: socket.gethostbyname(h) for h in sys.argv[2:]},
    "outside": outside,
}))
"""


def test_the_three_clients_share_one_store_and_nothing_leaves_the_loopback(gcs):
    gcs.create_bucket("clients-bucket")
    mark = gcs.mark()
    seen = json.loads(gcs.python(CLIENTS, "clients-bucket", *HOSTS, cwd=REPO))
    assert seen["tf_reads"] == "written by tensorstore"
    assert seen["ts_reads"] == "by google-cloud-storage"
    assert seen["gcs_reads"] == "written by TensorFlow"
    contents = {
        "tf/a.txt": b"written by TensorFlow",
        "tf/empty": b"",
        "ts/b.bin": b"written by tensorstore",
        "gcs/c.bin": b"by google-cloud-storage",
    }
    for name, data in contents.items():  # the emulator's crc32c is google-crc32c's
        crc32c = base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()
        assert seen["listing"][name] == [len(data), crc32c], name
    assert seen["interfaces"] == ["lo"] and seen["outside"] == "Network is unreachable"
    assert seen["hosts"] == dict.fromkeys(HOSTS, "127.0.0.1")
    served = gcs.requests(mark)
    assert {r["host"] for r in served} == {"www.googleapis.com", "storage.googleapis.com"}
    assert all(r["status"] < 400 or r["method"] == "GET" for r in served), served  # 404: lookups


GAPS = """
import http.client, json, ssl, sys
def request(connection, method, path, body=b"", headers=None):
    connection.request(method, path, body, headers or {})
    response = connection.getresponse()
    return response.status, response.read()
bare = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
tls = ssl.create_default_context()
front = http.client.HTTPSConnection("storage.googleapis.com", context=tls)
results = {}
for name, connection in (("bare", bare), ("front", front)):
    base = f"/upload/storage/v1/b/gaps-bucket/o?uploadType=media&name={name}"
    # 1. TensorFlow's empty POST: no body, "Transfer-Encoding: identity".
    connection.putrequest("POST", base + "-empty")
    connection.putheader("Transfer-Encoding", "identity")
    connection.endheaders()
    response = connection.getresponse()
    response.read()
    results[name + " empty POST"] = response.status
    if response.status == 501:
        connection.close()
    # 2. Generation conditions on DELETE, GET and media uploads.
    status, body = request(connection, "POST", base, b"v1")
    generation = json.loads(body)["generation"]
    stale = str(int(generation) + 1)
    obj = f"/storage/v1/b/gaps-bucket/o/{name}"
    condition = f"?ifGenerationMatch={stale}"
    results[name + " GET stale"] = request(connection, "GET", obj + condition)[0]
    over = request(connection, "POST", base + "&ifGenerationMatch=0", b"v2")
    results[name + " upload over"] = over[0]
    results[name + " DELETE stale"] = request(connection, "DELETE", obj + condition)[0]
    results[name + " after"] = request(connection, "GET", obj)[0]
    # 3. A resumable upload's status query, before any byte arrived.
    session = f"/upload/storage/v1/b/gaps-bucket/o?uploadType=resumable&name={name}-resumable"
    connection.request("POST", session, b"", {"X-Forwarded-Proto": "https"})
    response = connection.getresponse()
    response.read()
    upload = "/" + response.getheader("Location").split("/", 3)[3]
    status, _ = request(connection, "PUT", upload, b"", {"Content-Range": "bytes */5"})
    results[name + " status query"] = status
print(json.dumps(results))
"""


def test_the_emulator_gaps_are_real_and_the_front_closes_them(gcs):
    """If the bare emulator stops showing a gap, front.py's workaround for it can go."""
    gcs.create_bucket("gaps-bucket")
    results = json.loads(gcs.python(GAPS, str(front.EMULATOR_PORT)))
    assert results == {
        "bare empty POST": 501, "front empty POST": 200,  # gap 1
        "bare GET stale": 200, "front GET stale": 412,  # gap 2: conditions ignored ...
        "bare upload over": 200, "front upload over": 412,
        "bare DELETE stale": 200, "front DELETE stale": 412,
        "bare after": 404, "front after": 200,  # ... so the bare DELETE removed the object
        "bare status query": 200, "front status query": 308,  # gap 3: 200 = an empty object
    }  # fmt: skip


FAULTS = """
import http.client, json, ssl, sys, time
results = []
for _ in range(5):
    tls = ssl.create_default_context()
    connection = http.client.HTTPSConnection("storage.googleapis.com", context=tls)
    started = time.monotonic()
    try:
        connection.request("GET", "/storage/v1/b/faults-bucket")
        response = connection.getresponse()
        results.append([response.status, len(response.read())])
    except OSError as e:
        results.append([type(e).__name__, 0])
    results[-1].append(round(time.monotonic() - started, 1))
print(json.dumps(results))
"""


def test_faults_apply_in_order_and_every_request_is_logged(gcs):
    gcs.create_bucket("faults-bucket")
    faults = [("503", {}), ("reset", {}), ("slow", {"seconds": 1.0}), ("hold", {"seconds": 1.0})]
    rules = [{"match": "^GET storage.googleapis.com/storage/v1/b/faults-bucket$", "fault": f,
              "count": 1, **extra} for f, extra in faults]  # fmt: skip
    mark = gcs.mark()
    with gcs.faults(rules):
        results = json.loads(gcs.python(FAULTS))
    # OpenSSL reports the reset (RST) during a TLS read as an EOF: http.client's RemoteDisconnected.
    assert [r[0] for r in results] == [503, "RemoteDisconnected", 200, 200, 200]
    assert [r[2] >= 1.0 for r in results] == [False, False, True, True, False]
    log = gcs.requests(mark)
    assert [r["fault"] for r in log] == ["503", "reset", "slow", "hold", "hold", None]
    assert [r["status"] for r in log] == [503, 0, 200, 0, 200, 200]  # a hold: logged twice
    assert log[-1]["out"] == results[-1][1] > 100  # bytes served


def test_without_namespaces_the_fixture_says_why_in_one_line(tmp_path):
    """As in a container without CAP_SYS_ADMIN (or a user without root): unshare is refused."""
    code = (
        "import sys\nfrom tests.gcs.emulator import Emulator, Unavailable\n"
        "try:\n    Emulator.start(sys.argv[1])\nexcept Unavailable as e:\n    print(e)\n"
    )
    result = subprocess.run(
        ["setpriv", "--bounding-set=-sys_admin", sys.executable, "-c", code, str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == [
        "cannot make a network and mount namespace here "
        "(unshare: unshare failed: Operation not permitted)"
    ]


def test_the_servers_die_with_the_process_that_started_them(tmp_path):
    code = (
        "import os, sys, time\nfrom tests.gcs.emulator import Emulator\n"
        "gcs = Emulator.start(sys.argv[1])\n"
        "children = open(f'/proc/{gcs.holder.pid}/task/{gcs.holder.pid}/children').read()\n"
        "print(gcs.holder.pid, children.strip(), flush=True)\ntime.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "gcs")], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2  # the namespace holder and fake-gcs-server
    started = time.monotonic()
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() - started < 10, pids
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its (new) parent to reap it."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_emulator_starts_in_about_a_second(tmp_path):
    started = time.monotonic()
    emulator = Emulator.start(tmp_path / "gcs")
    took = time.monotonic() - started
    emulator.stop()
    assert took < 2.0, f"the namespace took {took:.2f} s to start"
