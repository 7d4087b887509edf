"""``python -m bertjax.main`` with its TFRecords, vocab and workdir on gs://, crashed and resumed.

main_test's tiny run (8 steps, a checkpoint every 2, here all kept) on ``create_pretraining_data``'s
TFRecords in the hermetic GCS (``gcs_data``), its params initialised from a params-only checkpoint
on gs:// (``config.init_checkpoint``; a run whose workdir holds no checkpoint reads it). The
front's ``hold`` fault stops a chosen request until the client is killed, so each ``kill -9``
lands exactly where it is meant to:

1. an uninterrupted reference run: it reads its init checkpoint, trains, evaluates, checkpoints
   and writes TensorBoard on gs://; sealing a step reads none of it (the request log);
2. one workdir (at ``keep=1``) killed mid-save (while a second run on it is refused), between a
   step's commit and its seal, mid-deletion of a rejected step, right after a sealed save
   (mid-step), stopped by SIGTERM (saves, exits 0), and finished under transient faults (503s,
   resets before and after the request was applied, slow answers): bit-identical to the
   reference;
3. the reference's checkpoints with the newest step's object replaced by a flipped copy and the
   next one's data object missing: both named, the run resumes from the step before and ends
   bit-identical; the damaged step's data was never downloaded (verified from the listing);
4. permanent faults (403 on the workdir's bucket, a data bucket that does not exist): one line
   naming the gs:// path, well within a minute (both runs in one process: ``COMMANDS``).
"""

import json
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.commands.faults_test import _until_step
from tests.commands.main_test import NUM_STEPS, _overrides, env
from tests.gcs.conftest import COMMANDS, FLAT_PARAMS, REPO

pytestmark = pytest.mark.xdist_group("gcs")
__all__ = ["env"]  # main_test's fixture, instantiated for this module
WORK = "bertjax-work"

SAME_PARAMS = (
    """
import json, sys
import bertjax
import numpy as np
from bertjax.training import workdir
"""
    + FLAT_PARAMS
    + """
got, want = (dict(flat(workdir.latest_params(p, log=lambda _: None)[0])) for p in sys.argv[1:3])
print(json.dumps(sorted(k for k in want if k not in got or not np.array_equal(got[k], want[k]))))
"""
)

OBJECTS = """
import json, sys
from google.cloud import storage
bucket, prefix = sys.argv[1][5:].split("/", 1)
print(json.dumps({b.name[len(prefix):]: b.size for b in storage.Client().list_blobs(bucket,
                                                                                  prefix=prefix)}))
"""


class Runs:
    """main_test's command, with this module's gs:// config, run inside the namespace."""

    def __init__(self, gcs, env, config, init_checkpoint):
        self.gcs, self.environ, self.config = gcs, env[2], config
        self.overrides = [*_overrides(env[1]), "--config.checkpoint.keep=10",
                          f"--config.init_checkpoint={init_checkpoint}"]  # fmt: skip

    def command(self, workdir, *extra):
        return [sys.executable, "-m", "bertjax.main", f"--config={self.config}",
                f"--workdir={workdir}", *self.overrides, *extra]  # fmt: skip

    def start(self, workdir, *extra) -> subprocess.Popen:
        return self.gcs.popen(self.command(workdir, *extra), env=self.environ, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip

    def run(self, workdir, *extra, timeout=300):
        return self.gcs.run(self.command(workdir, *extra), env=self.environ, cwd=REPO,
                            timeout=timeout)  # fmt: skip

    def same_params(self, workdir, reference) -> None:
        differ = json.loads(self.gcs.python(SAME_PARAMS, workdir, reference, cwd=REPO))
        assert differ == [], f"{workdir} differs from {reference} in {differ}"

    def objects(self, prefix: str) -> dict[str, int]:
        return json.loads(self.gcs.python(OBJECTS, prefix))


@pytest.fixture(scope="module")
def runs(gcs, gcs_data, env):
    gcs.create_bucket(WORK)
    config = env[0] / "gcs_config.py"
    config.write_text(
        f"import sys\nsys.path.insert(0, {str(REPO / 'configs')!r})\nimport tiny\n\n\n"
        "def get_config():\n    config = tiny.get_config()\n"
        "    config.data.source = 'tfrecord'\n"
        f"    config.data.input_files = config.data.eval_input_files = [{gcs_data.tfrecords!r}]\n"
        f"    config.data.vocab_file = {gcs_data.vocab!r}\n"
        "    return config\n"
    )
    return Runs(gcs, env, config, gcs_data.params)


@pytest.fixture(scope="module")
def reference(gcs, runs):
    mark = gcs.mark()
    result = runs.run(f"gs://{WORK}/reference")
    assert result.returncode == 0, result.stderr[-3000:]
    return f"gs://{WORK}/reference", result.stdout, gcs.requests(mark)


def _name(request) -> str:
    """The object a request is about, '/'-separated (upload: its ``name``; else its path)."""
    query = dict(p.split("=", 1) for p in request["query"].split("&") if "=" in p)
    return (query.get("name") or request["path"]).replace("%2F", "/")


def _one_line_error(result) -> str:
    """The one line a failed run printed on stderr, besides tensorstore's INFO line saying which
    credentials it uses: tensorstore (orbax, reading the gs:// init checkpoint) logs it before
    any absl logging is set up, and the fixture's GOOGLE_AUTH_TOKEN_FOR_TESTING is what it
    reports here (``Using credentials at ...`` with real ones)."""
    assert result.returncode == 1, result.stderr[-3000:]
    lines = [line for line in result.stderr.strip().splitlines()
             if not re.match(r"I\d{4} .* google_auth_provider\.cc:\d+\] ", line)]  # fmt: skip
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def _media_reads(requests, prefix: str) -> dict[str, int]:
    """Object name under gs://WORK/``prefix`` (relative to it) -> bytes of it served by media
    downloads (JSON API ``alt=media``, or the XML API's paths)."""
    read = {}
    for r in requests:
        path = r["path"].replace("%2F", "/")
        media = "alt=media" in r["query"].split("&") or path.startswith(f"/{WORK}/")
        name = path.split(f"/{WORK}/o/" if "/o/" in path else f"/{WORK}/", 1)[-1]
        if r["method"] == "GET" and media and name.startswith(prefix):
            read[name[len(prefix) :]] = read.get(name[len(prefix) :], 0) + r["out"]
    return read


def test_a_gcs_run_trains_checkpoints_and_writes_tensorboard(runs, reference):
    workdir, stdout, requests = reference
    init_checkpoint = runs.overrides[-1].split("=", 1)[1]
    assert f"init_checkpoint {init_checkpoint} (bertjax): loaded encoder, pooler, mlm, nsp; " \
           "initialised none\n" in stdout  # fmt: skip
    assert len([line for line in stdout.splitlines() if line.startswith("step ")]) == NUM_STEPS
    assert f"eval step {NUM_STEPS} mlm_loss" in stdout and "final summary:" in stdout
    names = runs.objects(f"{workdir}/")
    assert {"bertjax_workdir.json", "bert_config.json", "vocab.txt", "config.json"} <= set(names)
    assert "bertjax_lease.json" not in names  # released
    assert [n for n in names if n.startswith("tensorboard/events.out.tfevents.")]
    for step in range(2, NUM_STEPS + 1, 2):
        assert f"checkpoints/{step}/bertjax_manifest.json" in names
    # Sealing read nothing back. Orbax itself reads its index (OCDBT manifests and b-tree nodes)
    # and metadata when it finalizes a save: 2% of the bytes here; reading a step to checksum it
    # would be 100%.
    sizes = {k: v for k, v in names.items() if k.startswith("checkpoints/")}
    reads = _media_reads(requests, "reference/checkpoints/")
    assert sum(reads.values()) < 0.1 * sum(sizes.values()), (reads, sizes)
    written = sum(r["in"] for r in requests if "reference/checkpoints/" in _name(r))
    assert written > 4 * 100_000  # four saves of the train state were uploaded


def _wait_for(gcs, mark, proc, predicate, what: str, timeout=240) -> dict:
    """The first request after ``mark`` that ``predicate`` accepts; fails if ``proc`` ends."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [r for r in gcs.requests(mark) if predicate(r)]
        if found:
            return found[0]
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {proc.stderr.read()[-3000:]}")
        time.sleep(0.02)
    raise AssertionError(f"no {what} within {timeout} s")


def _kill(proc) -> str:
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    return out


def _held(gcs, runs, workdir, pattern: str, what: str, *extra, skip: int = 0):
    """Starts a run whose request matching ``pattern`` after ``skip`` others is held;
    -> (the run, the held request)."""
    mark = gcs.mark()
    with gcs.faults([{"match": pattern, "fault": "hold", "skip": skip, "count": 1}]):
        proc = runs.start(workdir, *extra)
        held = _wait_for(gcs, mark, proc, lambda r: r["fault"] == "hold", what)
    return proc, held


def test_kill_9_at_each_moment_that_matters_then_resume_is_bit_identical(gcs, runs, reference):
    """At ``keep=1``, where a kill between a step's commit and its seal must leave the step
    sealed before it (``bertjax.training.retention``)."""
    workdir, keep = f"gs://{WORK}/killed", "--config.checkpoint.keep=1"
    steps = "name=killed%2Fcheckpoints%2F"
    # Mid-save: the first data upload of step 2 hangs. A second run on the workdir is refused.
    first, held = _held(gcs, runs, workdir, rf"^POST storage\S*{steps}2%2Fstate%2F", "a save", keep)
    line = _one_line_error(runs.run(workdir, "--config.optimizer.learning_rate=0.001"))
    assert f"main: error: {workdir} is in use by host " in line and f" pid {first.pid} " in line
    _kill(first)
    # Between commit and seal: step 2 is sealed, step 4 committed, its manifest upload hangs.
    # Step 2 (incomplete) was skipped and deleted.
    second, held = _held(gcs, runs, workdir, rf"{steps}4%2Fbertjax_manifest.json", "a seal", keep)
    out = _kill(second)
    assert "checkpoint step 2: " in out and "(incomplete save); none left" in out
    assert f"checkpoint step 2: deleting {workdir}/checkpoints/2 (it did not verify)" in out
    # Mid-deletion: 4 is complete for orbax but unsealed, so it is deleted; the fourth DELETE
    # hangs, three objects are gone. Step 2 survived step 4's commit at keep=1.
    deletes = r"^DELETE \S*/o/killed%2Fcheckpoints%2F\d+%2F"
    third, held = _held(gcs, runs, workdir, deletes, "a deletion", keep, skip=3)
    out = _kill(third)
    assert "checkpoint step 4: no manifest (incomplete save); trying step 2" in out
    assert f"restored step 2 from {workdir}/checkpoints" in out
    # Right after a save: killed at the first step once step 4's manifest is written (mid-step).
    mark = gcs.mark()
    fourth = runs.start(workdir, keep)
    _wait_for(gcs, mark, fourth, lambda r: r["method"] == "PUT" and r["status"] == 200
              and "checkpoints/4/bertjax_manifest.json" in _name(r), "step 4's seal")  # fmt: skip
    out = _kill(fourth)
    assert f"restored step 2 from {workdir}/checkpoints" in out  # the half-deleted step skipped
    # SIGTERM: the run saves the step it is at and exits 0.
    fifth = runs.start(workdir, keep)
    stopped_at = _until_step(fifth)
    fifth.send_signal(signal.SIGTERM)
    out, err = fifth.communicate(timeout=120)
    assert fifth.returncode == 0, err[-3000:]
    assert stopped_at >= 5 and "SIGTERM: saving step " in out  # restored step 4 or later
    saved = int(out.split("SIGTERM: saving step ")[1].split()[0])
    assert f"checkpoints/{saved}/bertjax_manifest.json" in runs.objects(f"{workdir}/")
    # To the end through a faulty network: on 2% of requests each (dozens of each kind), a 503,
    # a reset before the request is forwarded, a reset after it was applied (the answer is lost),
    # a slow answer. (Each fault TensorFlow's GCS client retries cost it about 0.5 s here even
    # with its retry delays set to 10 ms, cause not found: at 4% this run took about a minute.)
    mark = gcs.mark()
    kinds = {"503": {}, "reset": {}, "reset_after": {}, "slow": {"seconds": 0.3}}
    with gcs.faults([{"match": "", "fault": k, "share": 0.02, **v} for k, v in kinds.items()]):
        result = runs.run(workdir, keep)
    assert result.returncode == 0, result.stderr[-3000:]
    injected = {r["fault"] for r in gcs.requests(mark)}
    assert set(kinds) <= injected, injected
    runs.same_params(workdir, reference[0])


COPY_AND_DAMAGE = """
import json, sys
from google.cloud import storage
bucket = storage.Client().bucket(sys.argv[1])
source, target = sys.argv[2], sys.argv[3]
for blob in bucket.list_blobs(prefix=source):
    bucket.copy_blob(blob, bucket, target + blob.name[len(source):])

def largest(step):
    blobs = bucket.list_blobs(prefix=f"{target}checkpoints/{step}/state/")
    return max((b for b in blobs if "/d/" in b.name), key=lambda b: b.size)

newest, older = largest(8), largest(6)
data = bytearray(newest.download_as_bytes())
data[len(data) // 2] ^= 0x01
bucket.blob(newest.name).upload_from_string(bytes(data))  # the same size, one bit flipped
older.delete()
print(json.dumps({"flipped": newest.name[len(target):], "removed": older.name[len(target):]}))
"""


def test_damaged_newest_steps_fall_back_to_the_newest_that_verifies(gcs, runs, reference):
    workdir = f"gs://{WORK}/damaged"
    damage = json.loads(gcs.python(COPY_AND_DAMAGE, WORK, "reference/", "damaged/"))
    flipped = damage["flipped"].removeprefix(f"checkpoints/{NUM_STEPS}/")
    removed = damage["removed"].removeprefix(f"checkpoints/{NUM_STEPS - 2}/")
    sizes = runs.objects(f"{workdir}/checkpoints/")
    mark = gcs.mark()
    result = runs.run(workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert f"checkpoint step {NUM_STEPS} failed verification: {flipped}: checksum differs: " in out
    assert f"checkpoint step {NUM_STEPS - 2} failed verification: {removed}: missing; " in out
    assert f"restored step {NUM_STEPS - 4} from {workdir}/checkpoints" in out
    for step in (NUM_STEPS, NUM_STEPS - 2):
        assert f"checkpoint step {step}: deleting {workdir}/checkpoints/{step} " in out
    served = gcs.requests(mark)
    runs.same_params(workdir, reference[0])
    copies = [r["path"] for r in served if "rewriteTo" in r["path"] or "copyTo" in r["path"]]
    assert not [path for path in copies if "checkpoints" in path], copies  # nothing renamed
    # Verification read nothing: the newest step's data objects were never downloaded (reading
    # them is how a checksum would find the flipped bit), though the restored step's were.
    reads = _media_reads(served, "damaged/checkpoints/")
    data = [name for name, size in sizes.items() if "/d/" in name and size > 100_000]
    assert [name for name in data if name.startswith(f"{NUM_STEPS}/")], data
    assert not [name for name in data if name.startswith(f"{NUM_STEPS}/") and name in reads]
    assert [name for name in data if name.startswith(f"{NUM_STEPS - 4}/") and name in reads]


def test_permanent_faults_are_one_line_naming_the_path_within_a_minute(gcs, runs):
    """Both runs in one process in the namespace (``COMMANDS``: refused before their devices
    compute, a start-up saved); the 403 is injected on every request about its bucket alone."""
    gcs.create_bucket("bertjax-denied")
    denied = [{"match": "bertjax-denied", "fault": "403"}]  # every request about the bucket
    cases = [  # (workdir, overrides, what the line must say, the gs:// path it must name)
        ("gs://bertjax-denied/run", [],
         "HTTP response code 403 with body '{\"error\": {\"code\": 403, \"message\": \"injected by "
         "the test front\"", "gs://bertjax-denied/run"),
        (f"gs://{WORK}/never", ["--config.data.input_files=gs://bertjax-missing/train-*"],
         "HTTP response code 404", "gs://bertjax-missing/"),
    ]  # fmt: skip
    argvs = [["bertjax.main", *runs.command(workdir, *extra)[3:]] for workdir, extra, *_ in cases]
    with gcs.faults(denied):
        out = gcs.python(COMMANDS, json.dumps(argvs), env=runs.environ, cwd=REPO, timeout=240)
    results = [json.loads(line) for line in out.splitlines() if line.startswith('{"code": ')]
    for (_, _, reason, named), result in zip(cases, results, strict=True):
        done = subprocess.CompletedProcess([], result["code"], result["stdout"], result["stderr"])
        line = _one_line_error(done)
        assert line.startswith("main: error: ") and reason in line and named in line, line
        assert result["seconds"] < 60, f"{result['seconds']:.0f} s: {line}"
