"""Workdir lease: one live holder, dead or expired holders taken over by exactly one process,
renewal, loss on takeover; the GCS backend against an in-memory bucket with GCS's preconditions.
"""

import inspect
import json
import multiprocessing
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time

import pytest

from bertjax.training import lease, lease_stores

# ---------------------------------------------------------------- helpers


def _record(**overrides) -> lease.LeaseRecord:
    now = time.time()
    fields = dict(
        host="other-host",
        pid=123,
        machine="",
        token=secrets.token_hex(16),
        started=now - 3600,
        renewed=now,
        ttl_seconds=120.0,
        renew_every=30.0,
    )
    return lease.LeaseRecord(**{**fields, **overrides})


def _put(store, record: lease.LeaseRecord) -> None:
    current = store.read()
    if current is None:
        store.create(record.to_bytes())
    else:
        store.replace(record.to_bytes(), current.version)


def _on_disk(workdir) -> dict:
    return json.loads((workdir / lease.LEASE_FILE).read_text())


def _wait_for(predicate, seconds=5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


# ---------------------------------------------------------------- local backend


def test_acquire_writes_the_holder_and_release_removes_it(tmp_path):
    before = time.time()
    held = lease.acquire(tmp_path, log=None)
    record = _on_disk(tmp_path)
    assert record["host"] == socket.gethostname() and record["pid"] == os.getpid()
    assert before <= record["started"] == record["renewed"] <= time.time()
    assert record["ttl_seconds"] == 120 and record["renew_every"] == 30
    assert len(record["token"]) == 32 and held.notice is None and not held.lost
    assert held.release() is True
    assert not (tmp_path / lease.LEASE_FILE).exists()
    assert held.release() is False  # only once


def test_a_live_holder_is_named_in_one_line(tmp_path):
    store = lease_stores.LocalStore(tmp_path)
    _put(store, _record(started=1795496400.0, renewed=time.time() - 12))  # 2026-11-24T05:00Z
    with pytest.raises(lease.LeaseError) as e:
        lease.acquire(tmp_path, log=None)
    message = str(e.value)
    assert "\n" not in message
    assert re.fullmatch(
        rf"{re.escape(str(tmp_path))} is in use by host other-host pid 123 since "
        r"2026-11-24T05:00:00Z \(renewed 1[23] s ago\); stop that run or use another workdir "
        r"\(a holder that stops renewing is taken over 10[78] s after its last renewal\)",
        message,
    ), message


def test_my_own_live_lease_blocks_a_second_acquire(tmp_path):
    with lease.acquire(tmp_path, log=None):
        with pytest.raises(lease.LeaseError, match=f"pid {os.getpid()} since"):
            lease.acquire(tmp_path, log=None)


def test_an_expired_holder_is_taken_over_with_a_notice(tmp_path):
    store = lease_stores.LocalStore(tmp_path)
    _put(store, _record(renewed=time.time() - 600))
    lines = []
    with lease.acquire(tmp_path, log=lines.append) as held:
        assert lines == [
            f"taking over the lease of {tmp_path} from host other-host pid 123 "
            "(last renewed 10 min ago)"
        ]
        assert held.notice == lines[0]
        assert _on_disk(tmp_path)["token"] == held.record.token


def test_a_dead_pid_on_this_machine_is_taken_over_before_the_ttl(tmp_path):
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead_pid = int(child.stdout)  # exited and reaped
    store = lease_stores.LocalStore(tmp_path)
    probe = lease.acquire(tmp_path, log=None)
    mine = probe.record  # the host and machine id this process writes
    probe.release()
    _put(store, _record(host=mine.host, machine=mine.machine, pid=dead_pid, renewed=time.time()))
    lines = []
    with lease.acquire(tmp_path, log=lines.append):
        assert lines[0].endswith(
            f"pid {dead_pid} (no longer running on this host; last renewed 0 s ago)"
        )
    # The same record from another machine (other boot id or pid namespace) is not judged by pid.
    _put(store, _record(host=mine.host, machine="other-boot/1", pid=dead_pid))
    with pytest.raises(lease.LeaseError, match="is in use by host"):
        lease.acquire(tmp_path, log=None)


def test_renewal_advances_the_record(tmp_path):
    with lease.acquire(tmp_path, ttl_seconds=1.0, renew_every=0.05, log=None) as held:
        started = _on_disk(tmp_path)["renewed"]
        assert _wait_for(lambda: _on_disk(tmp_path)["renewed"] >= started + 0.1)
        assert _on_disk(tmp_path)["token"] == held.record.token and not held.lost


def test_a_holder_that_was_taken_over_marks_itself_lost_and_keeps_its_hands_off(tmp_path):
    held = lease.acquire(tmp_path, ttl_seconds=1.0, renew_every=0.05, log=None)
    intruder = _record(pid=4242)
    _put(lease_stores.LocalStore(tmp_path), intruder)
    assert _wait_for(lambda: held.lost)
    with pytest.raises(lease.LeaseError) as e:
        held.check()
    assert str(e.value) == (
        f"{tmp_path}: this run lost its lease (taken over by host other-host pid 4242 at "
        f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(intruder.started))}); "
        "stopping without writing"
    )
    assert held.release() is False
    assert _on_disk(tmp_path)["token"] == intruder.token


def test_a_removed_record_also_means_lost(tmp_path):
    held = lease.acquire(tmp_path, ttl_seconds=1.0, renew_every=0.05, log=None)
    os.remove(tmp_path / lease.LEASE_FILE)
    assert _wait_for(lambda: held.lost)
    with pytest.raises(lease.LeaseError, match="its record was removed"):
        held.check()


def test_not_a_lease_and_bad_arguments_are_one_line_errors(tmp_path):
    (tmp_path / lease.LEASE_FILE).write_text('{"host": "h"}')
    with pytest.raises(lease.LeaseError, match=rf"{lease.LEASE_FILE}: not a bertjax lease"):
        lease.acquire(tmp_path, log=None)
    with pytest.raises(ValueError, match=r"ttl_seconds=50 must be at least 2 x renew_every=30"):
        lease.acquire(tmp_path, ttl_seconds=50, log=None)
    with pytest.raises(ValueError, match=r"s3://b/w: a workdir lease needs a local path or gs://"):
        lease.acquire("s3://b/w", log=None)


def test_gs_without_the_client_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "google.cloud.storage", None)  # import fails
    cloud = sys.modules.get("google.cloud")
    if cloud is not None and hasattr(cloud, "storage"):
        monkeypatch.delattr(cloud, "storage")
    with pytest.raises(ValueError, match=r"gs://b/w: .*pip install 'bertjax\[gcs\]'$"):
        lease.acquire("gs://b/w", log=None)


def _race_worker(workdir, start, done, results):
    start.wait()
    try:
        held = lease.acquire(workdir, log=None)
        results.put(("won", held.record.token))
    except lease.LeaseError as e:
        results.put(("refused", str(e)))
    done.wait()  # the winner stays alive (and live) until every contender has tried


@pytest.mark.parametrize("stale", [True, False], ids=["takeover", "first-create"])
def test_processes_racing_for_one_lease_exactly_one_wins(tmp_path, stale):
    if stale:
        _put(lease_stores.LocalStore(tmp_path), _record(renewed=time.time() - 1000))
    contenders = 6
    context = multiprocessing.get_context("spawn")  # no fork of a process that may run XLA
    start, done = context.Barrier(contenders), context.Barrier(contenders)
    results = context.Queue()
    procs = [
        context.Process(target=_race_worker, args=(str(tmp_path), start, done, results))
        for _ in range(contenders)
    ]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    winners = [token for kind, token in outcomes if kind == "won"]
    assert len(winners) == 1, outcomes
    assert _on_disk(tmp_path)["token"] == winners[0]
    assert all("is in use by host" in text for kind, text in outcomes if kind == "refused")


# ---------------------------------------------------------------- GCS backend, in memory


@pytest.fixture(params=["google-api-core", "stand-in"])
def bucket(request, monkeypatch):
    """A FakeBucket raising google-api-core's exceptions, or the stand-ins used without it."""
    if request.param == "google-api-core":
        pytest.importorskip("google.api_core.exceptions")
    else:
        monkeypatch.setitem(sys.modules, "google.api_core", None)  # import fails
    return FakeBucket()


class FakeBucket:
    """One GCS bucket in memory, with the JSON API's generation semantics (GCS docs, "Request
    preconditions" and "Generation numbers"): every write makes a new generation number, unique
    but not ordered; ``if_generation_match=0`` succeeds only if no live object exists; another
    value only if the live object has that generation; failures are 412 PreconditionFailed; a
    read or delete of a missing object is 404 NotFound.

    ``answer_next_upload_twice`` applies the next upload and then answers it as its retry would:
    the client retries conditional uploads, and the retry of a write that landed gets a 412.
    """

    name = "fake-bucket"

    def __init__(self):
        self.objects: dict[str, tuple[int, bytes]] = {}
        self.lock = threading.Lock()
        self.answer_next_upload_twice = False
        self.latency_s = 0.0
        self.precondition_failed, self.not_found = lease_stores.gcs_errors()

    def get_blob(self, name):
        with self.lock:
            if name not in self.objects:
                return None
            return FakeBlob(self, name, self.objects[name][0])

    def blob(self, name):
        return FakeBlob(self, name, None)

    def check(self, name, if_generation_match):
        live = self.objects.get(name)
        if if_generation_match is None:
            return
        if (if_generation_match == 0 and live is not None) or (
            if_generation_match != 0 and (live is None or live[0] != if_generation_match)
        ):
            raise self.precondition_failed(f"412 {name}: precondition failed")


class FakeBlob:
    def __init__(self, bucket, name, generation):
        self.bucket, self.name, self.generation = bucket, name, generation

    def download_as_bytes(self, if_generation_match=None):
        with self.bucket.lock:
            if self.name not in self.bucket.objects:
                raise self.bucket.not_found(f"404 {self.name}")
            self.bucket.check(self.name, if_generation_match)
            data = self.bucket.objects[self.name][1]
        time.sleep(self.bucket.latency_s)  # a network round trip: other clients act meanwhile
        return data

    def upload_from_string(self, data, content_type=None, if_generation_match=None):
        with self.bucket.lock:
            self.bucket.check(self.name, if_generation_match)
            generation = secrets.randbits(62) + 1  # unique, unordered
            self.bucket.objects[self.name] = (generation, bytes(data))
            self.generation = generation
            if self.bucket.answer_next_upload_twice:
                self.bucket.answer_next_upload_twice = False
                self.bucket.check(self.name, if_generation_match)  # the retry: 412

    def delete(self, if_generation_match=None):
        with self.bucket.lock:
            if self.name not in self.bucket.objects:
                raise self.bucket.not_found(f"404 {self.name}")
            self.bucket.check(self.name, if_generation_match)
            del self.bucket.objects[self.name]


def test_the_fake_bucket_follows_gcs_preconditions(bucket):
    blob = bucket.blob("o")
    blob.upload_from_string(b"a", if_generation_match=0)
    first = blob.generation
    with pytest.raises(bucket.precondition_failed):
        bucket.blob("o").upload_from_string(b"b", if_generation_match=0)
    with pytest.raises(bucket.precondition_failed):
        bucket.blob("o").upload_from_string(b"b", if_generation_match=first + 1)
    bucket.blob("o").upload_from_string(b"b", if_generation_match=first)
    second = bucket.get_blob("o").generation
    assert second != first
    with pytest.raises(bucket.precondition_failed):
        bucket.get_blob("o").download_as_bytes(if_generation_match=first)
    with pytest.raises(bucket.precondition_failed):
        bucket.blob("o").delete(if_generation_match=first)
    bucket.blob("o").delete(if_generation_match=second)
    assert bucket.get_blob("o") is None
    with pytest.raises(bucket.not_found):
        bucket.blob("o").delete(if_generation_match=second)
    with pytest.raises(bucket.precondition_failed):  # a generation of a missing object
        bucket.blob("o").upload_from_string(b"c", if_generation_match=second)


def test_gcs_store_lease_lifecycle(bucket):
    store = lease_stores.GcsStore(bucket, "runs/a/bertjax_lease.json")
    held = lease.acquire("gs://fake-bucket/runs/a", log=None, store=store)
    with pytest.raises(lease.LeaseError, match=r"gs://fake-bucket/runs/a is in use by host"):
        lease.acquire("gs://fake-bucket/runs/a", log=None, store=store)
    generation = bucket.objects["runs/a/bertjax_lease.json"][0]
    held.renew()
    assert bucket.objects["runs/a/bertjax_lease.json"][0] != generation
    assert held.release() is True and not bucket.objects


def test_gcs_store_counts_a_write_answered_412_by_its_retry_as_written(bucket):
    store = lease_stores.GcsStore(bucket, "bertjax_lease.json")
    bucket.answer_next_upload_twice = True
    held = lease.acquire("gs://fake-bucket", log=None, store=store, ttl_seconds=60)
    bucket.answer_next_upload_twice = True
    held.renew()
    assert not held.lost
    record = json.loads(bucket.objects["bertjax_lease.json"][1])
    assert record["token"] == held.record.token and record["renewed"] == held.record.renewed
    assert held.release() is True


def test_gcs_takeover_by_threads_exactly_one_wins(bucket):
    store = lease_stores.GcsStore(bucket, "bertjax_lease.json")
    _put(store, _record(renewed=time.time() - 1000))
    bucket.latency_s = 0.01  # so that every contender reads before any writes
    start, outcomes = threading.Barrier(8), []

    def contend():
        start.wait()
        try:
            outcomes.append(("won", lease.acquire("gs://fake-bucket", log=None, store=store)))
        except lease.LeaseError as e:
            outcomes.append(("refused", str(e)))

    threads = [threading.Thread(target=contend) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [held for kind, held in outcomes if kind == "won"]
    assert len(winners) == 1, outcomes
    assert all("is in use by host" in text for kind, text in outcomes if kind == "refused")
    assert json.loads(bucket.objects["bertjax_lease.json"][1])["token"] == winners[0].record.token
    assert winners[0].release() is True


def test_gcs_store_calls_fit_the_real_client(monkeypatch):
    storage = pytest.importorskip("google.cloud.storage")
    uses = {
        storage.Bucket.get_blob: ("name",),
        storage.Blob.download_as_bytes: (),
        storage.Blob.upload_from_string: (b"data",),
        storage.Blob.delete: (),
    }
    for method, args in uses.items():
        keywords = {"if_generation_match": 7}
        if method is storage.Blob.upload_from_string:
            keywords["content_type"] = "application/json"
        inspect.signature(method).bind(None, *args, **keywords)  # TypeError if it does not fit
    buckets = []
    monkeypatch.setattr(storage, "Client", lambda: FakeClient(buckets))
    assert lease_stores.open_store("gs://b/runs/x/").where == "gs://b/runs/x/bertjax_lease.json"
    assert lease_stores.open_store("gs://b").where == "gs://b/bertjax_lease.json"
    assert buckets == ["b", "b"]


class FakeClient:
    def __init__(self, buckets):
        self.buckets = buckets

    def bucket(self, name):
        self.buckets.append(name)
        bucket = FakeBucket()
        bucket.name = name
        return bucket
