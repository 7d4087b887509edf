"""The workdir lease on gs:// through google-cloud-storage's generation preconditions, for real:
processes racing for a dead holder's lease (exactly one wins), and a conditional write whose
answer is lost (the client retries, GCS answers 412, and the write still counts as ours).
"""

import json
import sys
import time

import pytest

from tests.gcs.conftest import REPO

pytestmark = pytest.mark.xdist_group("gcs")
BUCKET = "bertjax-lease"

CONTEND = """
import json, sys, time
from bertjax.training import lease
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))  # all start together
try:
    held = lease.acquire(sys.argv[1], log=None)
    print(json.dumps(["won", held.record.token]), flush=True)
    time.sleep(float(sys.argv[3]))  # live until every contender has tried
    held.release()
except lease.LeaseError as e:
    print(json.dumps(["refused", str(e)]))
"""

STALE = """
import dataclasses, json, sys, time
from bertjax.training import lease, lease_stores
store = lease_stores.open_store(sys.argv[1])
record = lease.LeaseRecord(host="gone-host", pid=1, machine="", token="0" * 32, started=0.0,
                           renewed=time.time() - 1000, ttl_seconds=120.0, renew_every=30.0)
store.create(record.to_bytes())
"""

RECORD = """
import sys
from bertjax.training import lease_stores
snapshot = lease_stores.open_store(sys.argv[1]).read()
print(snapshot.data.decode() if snapshot else "null")
"""


@pytest.fixture(scope="module")
def bucket(gcs):
    gcs.create_bucket(BUCKET)
    return BUCKET


def test_processes_racing_for_a_dead_holders_lease_exactly_one_wins(gcs, bucket):
    workdir = f"gs://{bucket}/race"
    gcs.python(STALE, workdir, cwd=REPO)
    start = time.time() + 3.0
    contenders = [gcs.popen([sys.executable, "-c", CONTEND, workdir, str(start), "4"], cwd=REPO,
                            stdout=-1, stderr=-1) for _ in range(5)]  # fmt: skip
    outcomes = [json.loads(p.communicate(timeout=120)[0]) for p in contenders]
    winners = [token for kind, token in outcomes if kind == "won"]
    assert len(winners) == 1, outcomes
    assert all("is in use by host" in text for kind, text in outcomes if kind == "refused")
    assert gcs.python(RECORD, workdir, cwd=REPO).strip() == "null"  # the winner released it


ACQUIRE = """
import json, sys
from bertjax.training import lease, lease_stores
held = lease.acquire(sys.argv[1], log=None)
record = json.loads(lease_stores.open_store(sys.argv[1]).read().data)
print(json.dumps([held.record.token, record["token"], held.release()]))
"""


def test_a_conditional_write_whose_answer_is_lost_still_counts_as_written(gcs, bucket):
    workdir = f"gs://{bucket}/retried"
    mark = gcs.mark()
    rule = {"match": r"^POST \S*uploadType=multipart&ifGenerationMatch=0", "fault": "reset_after",
            "count": 1}  # fmt: skip
    with gcs.faults([rule]):
        token, recorded, released = json.loads(gcs.python(ACQUIRE, workdir, cwd=REPO))
    assert token == recorded and released  # acquired, then released by the same owner
    creates = [r["status"] for r in gcs.requests(mark) if "ifGenerationMatch=0" in r["query"]]
    assert creates == [200, 412], creates  # applied (answer lost), then the retry's 412
