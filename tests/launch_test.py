"""launch/*.sh against a fake gcloud (tests/testdata/launch/fake_gcloud.py), no network.

The fake validates every command and flag against the real gcloud's, records each call, plays
the queued resource's states, and runs ``tpu-vm ssh`` commands in fake worker homes (one
directory per host) with a fake ``uv`` and venv Python, so the tests check what lands on the
workers: the unpacked or cloned code, the uv calls, and the exact argv of ``bertjax.main``.
"""

import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).parents[1]
FAKES = pathlib.Path(__file__).parent / "testdata" / "launch"
SCRIPTS = ["create_tpu_vm.sh", "setup_tpu_vm.sh", "run_pretraining.sh", "tail_logs.sh"]
SCRIPTS += ["delete_tpu_vm.sh", "create_data_dataflow.sh", "create_vocab_dataflow.sh"]
ZONE = "us-central2-b"
QR_CREATE = ["compute", "tpus", "queued-resources", "create", "bert-pod", "--node-id=bert-pod"]
DESCRIBE = ["compute", "tpus", "queued-resources", "describe", "bert-pod"]
DESCRIBE += ["--format=value(state.state)", f"--zone={ZONE}"]
SSH = ["compute", "tpus", "tpu-vm", "ssh", "bert-pod"]
TRAIN_DATA, EVAL_DATA = "gs://bkt/tfrecords/train-*", "gs://bkt/tfrecords/eval-*"


def _install(source: pathlib.Path, target: pathlib.Path) -> None:
    target.write_text(f"#!{sys.executable}\n" + source.read_text())
    target.chmod(0o755)


class Launch:
    """Runs launch scripts with the fake gcloud first on PATH and ``workers`` fake hosts."""

    def __init__(self, tmp_path: pathlib.Path, workers: int = 1):
        self.tmp = tmp_path
        local_bin, worker_bin = tmp_path / "bin", tmp_path / "worker-bin"
        local_bin.mkdir()
        worker_bin.mkdir()
        _install(FAKES / "fake_gcloud.py", local_bin / "gcloud")
        _install(FAKES / "fake_python.py", local_bin / "python-local")
        _install(FAKES / "fake_uv.py", worker_bin / "uv")
        _install(FAKES / "fake_python.py", worker_bin / "venv-python")
        (worker_bin / "hostname").write_text('#!/bin/sh\nbasename "$HOME"\n')
        (worker_bin / "hostname").chmod(0o755)
        self.homes = [tmp_path / f"w{i}" for i in range(workers)]
        for home in self.homes:
            home.mkdir()
        self.log = tmp_path / "gcloud.jsonl"
        self.env = {
            "PATH": f"{local_bin}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "TMPDIR": str(tmp_path),
            "FAKE_GCLOUD_LOG": str(self.log),
            "FAKE_WORKER_HOMES": os.pathsep.join(map(str, self.homes)),
            "FAKE_WORKER_PATH": f"{worker_bin}:/usr/bin:/bin",
            "TPU_NAME": "bert-pod",
            "ZONE": ZONE,
            "POLL_SECONDS": "0",
        }

    def __call__(self, script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
        merged = {k: v for k, v in {**self.env, **env}.items() if v is not None}
        return subprocess.run(
            ["bash", str(REPO / "launch" / script), *args],
            env=merged,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def calls(self) -> list[dict]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [json.loads(line) for line in lines]

    def argvs(self) -> list[list[str]]:
        return [call["argv"] for call in self.calls()]


def _records(path: pathlib.Path, timeout: float = 10.0) -> list:
    """JSON lines of ``path``, waiting for a detached process to write the first one."""
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return [json.loads(line) for line in path.read_text().splitlines()]


def _flag(argv: list[str], name: str) -> str:
    return next(w.partition("=")[2] for w in argv if w.startswith(f"{name}="))


@pytest.fixture
def checkout(tmp_path):
    """A small bertjax checkout with a .git directory that must not be shipped."""
    root = tmp_path / "checkout"
    (root / ".git").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "setup.cfg").write_text("[metadata]\nname = bertjax\n")
    (root / "configs").mkdir()
    (root / "configs" / "large.py").write_text("# large\n")
    return root


def test_fake_gcloud_rejects_what_gcloud_rejects(tmp_path):
    launch = Launch(tmp_path)
    gcloud = str(tmp_path / "bin" / "gcloud")
    create = [*QR_CREATE, f"--zone={ZONE}", "--accelerator-type=v4-8", "--runtime-version=r"]
    bad = [
        [*create, "--best-effort"],  # the GA track has no --best-effort
        [*create, "--preemptible"],
        [*create[:-1]],  # no --runtime-version
        [*create, "--spot=yes"],
        ["compute", "tpus", "tpu-vm", "sshh", "bert-pod", f"--zone={ZONE}"],
        [*SSH, f"--zone={ZONE}", "--worker"],
    ]
    for argv in bad:
        result = subprocess.run([gcloud, *argv], env=launch.env, capture_output=True, text=True)
        assert result.returncode == 2, argv
        assert result.stderr.startswith("ERROR: (gcloud)"), result.stderr
    ok = subprocess.run([gcloud, "alpha", *create, "--best-effort"], env=launch.env)
    assert ok.returncode == 0


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_prints_the_usage_header(tmp_path, script):
    launch = Launch(tmp_path)
    result = launch(script, "--help", TPU_NAME=None, ZONE=None)
    assert result.returncode == 0, result.stderr
    header = (REPO / "launch" / script).read_text().splitlines()[1].removeprefix("# ")
    assert result.stdout.splitlines()[0] == header
    assert "ZONE" in result.stdout or "REGION" in result.stdout
    assert "shellcheck" not in result.stdout
    assert launch.calls() == []


@pytest.mark.parametrize(
    "script, unset, message",
    [
        ("create_tpu_vm.sh", "ZONE", "set ZONE (the TPU zone, e.g. us-central2-b)"),
        ("create_tpu_vm.sh", "ACCELERATOR", "set ACCELERATOR (the accelerator type, e.g. v4-8, "),
        ("setup_tpu_vm.sh", "TPU_NAME", "set TPU_NAME (the TPU VM name, as given to create_"),
        ("run_pretraining.sh", "WORKDIR", "set WORKDIR (gs://BUCKET/DIR for checkpoints and "),
        ("run_pretraining.sh", "DATA", "set DATA (TFRecords on GCS, e.g. gs://BUCKET/tfrecords"),
        ("tail_logs.sh", "ZONE", "set ZONE (the TPU zone, e.g. us-central2-b)"),
        ("delete_tpu_vm.sh", "TPU_NAME", "set TPU_NAME (the queued resource's name, as given"),
        ("create_data_dataflow.sh", "REGION", "set REGION (the Dataflow region, e.g. us-central1)"),
        ("create_data_dataflow.sh", "VOCAB", "set VOCAB (the vocab on GCS, e.g. gs://BUCKET/vo"),
        ("create_vocab_dataflow.sh", "PROJECT", "set PROJECT (the Google Cloud project)"),
        ("create_vocab_dataflow.sh", "OUTPUT", "set OUTPUT (gs://BUCKET/DIR/vocab.txt)"),
    ],
)
def test_a_missing_variable_is_one_line_and_exit_1(tmp_path, script, unset, message):
    launch = Launch(tmp_path)
    env = {"ACCELERATOR": "v4-8", "WORKDIR": "gs://bkt/run", "DATA": TRAIN_DATA, **DATAFLOW}
    env[unset] = None
    result = launch(script, **env)
    assert result.returncode == 1
    assert result.stderr.startswith(f"{script}: error: {message}")
    assert result.stderr.count("\n") == 1
    assert launch.calls() == []


@pytest.mark.parametrize(
    "accelerator, runtime",
    [
        ("v4-8", "tpu-ubuntu2204-base"),
        ("v4-32", "tpu-ubuntu2204-base"),
        ("v5litepod-8", "v2-alpha-tpuv5-lite"),
        ("v5litepod-16", "v2-alpha-tpuv5-lite"),
        ("v5p-8", "v2-alpha-tpuv5"),
        ("v6e-8", "v2-alpha-tpuv6e"),
    ],
)
def test_runtime_follows_the_generation(tmp_path, accelerator, runtime):
    launch = Launch(tmp_path)
    result = launch("create_tpu_vm.sh", ACCELERATOR=accelerator, DRY_RUN="1")
    assert result.returncode == 0, result.stderr
    create = shlex.split(result.stdout.splitlines()[0])
    assert create[:3] == ["+", "gcloud", "compute"] and f"--runtime-version={runtime}" in create


def test_an_unknown_generation_needs_runtime(tmp_path):
    launch = Launch(tmp_path)
    result = launch("create_tpu_vm.sh", ACCELERATOR="v9-8", DRY_RUN="1")
    assert result.returncode == 1 and "set RUNTIME" in result.stderr
    result = launch("create_tpu_vm.sh", ACCELERATOR="v9-8", RUNTIME="custom-rt", DRY_RUN="1")
    assert result.returncode == 0 and "--runtime-version=custom-rt" in result.stdout


def test_dry_run_prints_quoted_commands_and_runs_none(tmp_path, checkout):
    launch = Launch(tmp_path)
    env = {"ACCELERATOR": "v4-32", "CAPACITY": "spot", "REPO": str(checkout), "DRY_RUN": "1"}
    result = launch("create_tpu_vm.sh", **env)
    assert result.returncode == 0, result.stderr
    assert launch.calls() == [] and not (tmp_path / "w0" / "bertjax").exists()
    lines = [shlex.split(line) for line in result.stdout.splitlines()]
    assert all(words[0] == "+" for words in lines)
    assert [words[1] for words in lines] == ["gcloud", "gcloud", "tar", "gcloud", "gcloud"]
    assert lines[0][2:] == [
        *QR_CREATE,
        "--accelerator-type=v4-32",
        "--runtime-version=tpu-ubuntu2204-base",
        "--spot",
        f"--zone={ZONE}",
    ]
    assert lines[1][2:] == DESCRIBE
    assert lines[3][-2:] == ["--worker=all", f"--zone={ZONE}"]  # scp
    assert lines[4][2:8] == [*SSH, "--worker=all"]


def _create(launch: Launch, **env: str) -> subprocess.CompletedProcess:
    states = "WAITING_FOR_RESOURCES,PROVISIONING,ACTIVE"
    result = launch("create_tpu_vm.sh", FAKE_QR_STATES=states, **env)
    assert result.returncode == 0, result.stderr
    return result


def test_create_single_host_ships_the_checkout_and_installs_with_uv(tmp_path, checkout):
    launch = Launch(tmp_path, workers=1)
    result = _create(launch, ACCELERATOR="v5litepod-8", REPO=str(checkout))
    argvs = launch.argvs()
    assert argvs[0] == [
        *QR_CREATE,
        "--accelerator-type=v5litepod-8",
        "--runtime-version=v2-alpha-tpuv5-lite",
        f"--zone={ZONE}",
    ]
    assert argvs[1:4] == [DESCRIBE] * 3
    scp, ssh = launch.calls()[4:]
    assert scp["argv"][:4] == ["compute", "tpus", "tpu-vm", "scp"]
    assert scp["argv"][5:] == ["bert-pod:bertjax-src.tgz", "--worker=all", f"--zone={ZONE}"]
    assert "./setup.cfg" in scp["tar_members"]
    assert not [m for m in scp["tar_members"] if ".git" in m]
    assert ssh["argv"][:6] == [*SSH, "--worker=all"]
    assert ssh["argv"][6].startswith("--command=") and len(argvs) == 6

    home = launch.homes[0]
    assert (home / "bertjax" / "setup.cfg").exists() and not (home / "bertjax" / ".git").exists()
    assert not (home / "bertjax-src.tgz").exists()
    venv = f"{home}/bertjax-venv"
    pip_install = ["pip", "install", "--quiet", "--python", f"{venv}/bin/python"]
    assert _records(home / "uv.jsonl") == [
        ["venv", "--quiet", "--python", "3.11", venv],
        [*pip_install, "-c", f"{home}/bertjax/constraints.txt", "-e", f"{home}/bertjax[tpu,gcs]"],
    ]
    assert "w0 python 3.11.9 jax 0.10.2 bertjax ready" in result.stdout

    # Rerunning setup alone ships the code again and keeps the venv.
    rerun = launch("setup_tpu_vm.sh", REPO=str(checkout))
    assert rerun.returncode == 0, rerun.stderr
    assert [argv[0] for argv in _records(home / "uv.jsonl")] == ["venv", "pip", "pip"]


def test_create_multi_host_spot_clones_the_git_ref_on_every_worker(tmp_path):
    origin = tmp_path / "origin"
    git = ["git", "-C", str(origin), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(origin)], check=True)
    for version in ["v1", "v2"]:
        (origin / "setup.cfg").write_text(f"# {version}\n")
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-qm", version], check=True)
        subprocess.run([*git, "tag", version], check=True)
    launch = Launch(tmp_path, workers=4)  # v4-32: 16 chips, 4 hosts
    _create(launch, ACCELERATOR="v4-32", CAPACITY="spot", REPO=f"file://{origin}", REF="v1")
    argvs = launch.argvs()
    assert argvs[0] == [
        *QR_CREATE,
        "--accelerator-type=v4-32",
        "--runtime-version=tpu-ubuntu2204-base",
        "--spot",
        f"--zone={ZONE}",
    ]
    assert [argv[3] for argv in argvs[1:]] == ["describe"] * 3 + ["ssh"]  # no scp
    assert "--worker=all" in argvs[-1]
    for home in launch.homes:
        assert (home / "bertjax" / "setup.cfg").read_text() == "# v1\n"
        assert _records(home / "uv.jsonl")[1][-1] == f"{home}/bertjax[tpu,gcs]"


def test_best_effort_goes_through_the_alpha_track(tmp_path, checkout):
    launch = Launch(tmp_path, workers=2)  # v5litepod-16: 2 hosts of 8 chips
    env = {"ACCELERATOR": "v5litepod-16", "CAPACITY": "best-effort", "REPO": str(checkout)}
    _create(launch, **env, PROJECT="my-proj")
    argvs = launch.argvs()
    assert argvs[0][:5] == ["alpha", *QR_CREATE[:4]] and "--best-effort" in argvs[0]
    assert argvs[1][:4] == ["alpha", *DESCRIBE[:3]]
    assert all(argv[-1] == "--project=my-proj" for argv in argvs)
    assert all((home / "bertjax" / "setup.cfg").exists() for home in launch.homes)


@pytest.mark.parametrize("state", ["FAILED", "SUSPENDED"])
def test_create_stops_on_a_dead_request(tmp_path, checkout, state):
    launch = Launch(tmp_path)
    env = {"ACCELERATOR": "v4-8", "REPO": str(checkout)}
    result = launch("create_tpu_vm.sh", FAKE_QR_STATES=f"WAITING_FOR_RESOURCES,{state}", **env)
    assert result.returncode == 1
    last = result.stderr.splitlines()[-1]
    assert last.startswith(f"create_tpu_vm.sh: error: queued resource bert-pod is {state}; ")
    assert [argv[3] for argv in launch.argvs()] == ["create", "describe", "describe"]


def test_create_gives_up_after_the_timeout_and_on_a_failed_request(tmp_path, checkout):
    launch = Launch(tmp_path)
    env = {"ACCELERATOR": "v4-8", "REPO": str(checkout), "TIMEOUT_SECONDS": "1"}
    result = launch("create_tpu_vm.sh", FAKE_QR_STATES="WAITING_FOR_RESOURCES", **env)
    assert result.returncode == 1
    assert "still WAITING_FOR_RESOURCES after 1s" in result.stderr.splitlines()[-1]
    assert "ssh" not in {argv[3] for argv in launch.argvs()}

    failing = launch("create_tpu_vm.sh", FAKE_CREATE_FAIL="1", **env)
    assert failing.returncode == 1 and "no quota" in failing.stderr


def _worker_venvs(launch: Launch) -> None:
    """What setup_tpu_vm.sh leaves on each worker: the code and the venv's python."""
    for home in launch.homes:
        (home / "bertjax").mkdir()
        (home / "bertjax-venv" / "bin").mkdir(parents=True)
        shutil.copy(launch.tmp / "worker-bin" / "venv-python", home / "bertjax-venv/bin/python")


def test_run_pretraining_starts_the_same_detached_command_on_every_worker(tmp_path):
    launch = Launch(tmp_path, workers=4)
    _worker_venvs(launch)
    overrides = ["--config.model.dtype=bfloat16", "--config.data.vocab_file=my vocab/it's.txt"]
    env = {"WORKDIR": "gs://bkt/bert_large", "DATA": TRAIN_DATA, "EVAL_DATA": EVAL_DATA}
    result = launch("run_pretraining.sh", *overrides, **env)
    assert result.returncode == 0, result.stderr
    (ssh,) = launch.argvs()
    assert ssh[:6] == [*SSH, "--worker=all"] and ssh[7:] == [f"--zone={ZONE}"]
    for home in launch.homes:
        (record,) = _records(home / "python.jsonl")
        assert record == {
            "argv": [
                "-m",
                "bertjax.main",
                "--config=configs/large.py",
                "--workdir=gs://bkt/bert_large",
                "--config.data.source=tfrecord",
                f"--config.data.input_files={TRAIN_DATA}",
                f"--config.data.eval_input_files={EVAL_DATA}",
                *overrides,
            ],
            "cwd": str(home / "bertjax"),
            "session_leader": True,
            "unbuffered": "1",
        }
        logs = home / "bertjax-logs"
        assert os.readlink(logs / "latest.log") == "bert_large.log"
        assert (logs / "bertjax.pid").read_text().strip().isdigit()
        assert f"{home.name}: started bertjax.main" in result.stdout


def test_run_pretraining_from_tfds_without_eval(tmp_path):
    launch = Launch(tmp_path, workers=1)
    _worker_venvs(launch)
    env = {"TFDS_NAME": "wikipedia/20230601.en", "TFDS_DATA_DIR": "gs://bkt/tfds"}
    env |= {"WORKDIR": "gs://bkt/w", "CONFIG": "configs/bert_base.py"}
    result = launch("run_pretraining.sh", **env)
    assert result.returncode == 0, result.stderr
    (record,) = _records(launch.homes[0] / "python.jsonl")
    assert record["argv"][2:] == [
        "--config=configs/bert_base.py",
        "--workdir=gs://bkt/w",
        "--config.data.source=tfds",
        "--config.data.tfds_name=wikipedia/20230601.en",
        "--config.data.tfds_data_dir=gs://bkt/tfds",
        "--config.train.eval_every=0",
    ]


def test_run_pretraining_refuses_a_second_run_while_one_is_running(tmp_path):
    launch = Launch(tmp_path, workers=2)
    _worker_venvs(launch)
    env = {"WORKDIR": "gs://bkt/w", "DATA": TRAIN_DATA, "FAKE_TRAIN_SECONDS": "30"}
    try:
        assert launch("run_pretraining.sh", **env).returncode == 0
        _records(launch.homes[-1] / "python.jsonl")
        second = launch("run_pretraining.sh", **env)
        assert second.returncode == 1
        assert "w0: bertjax.main is already running" in second.stderr
    finally:  # stop the fake trainings this test started
        for pid_file in (home / "bertjax-logs" / "bertjax.pid" for home in launch.homes):
            if pid_file.exists():
                os.kill(int(pid_file.read_text()), signal.SIGTERM)


def test_run_pretraining_needs_setup_first(tmp_path):
    launch = Launch(tmp_path, workers=2)
    result = launch("run_pretraining.sh", WORKDIR="gs://bkt/w", DATA=TRAIN_DATA)
    assert result.returncode == 1
    assert "w0: no ~/bertjax-venv: run launch/setup_tpu_vm.sh first" in result.stderr


@pytest.mark.parametrize(
    "env, message",
    [
        ({"WORKDIR": "/tmp/w"}, "WORKDIR=/tmp/w is not a gs:// path"),
        ({"DATA": "/data/train-*"}, "DATA has '/data/train-*', not a gs:// path"),
        ({"EVAL_DATA": f"{EVAL_DATA},eval.tfrecord"}, "EVAL_DATA has 'eval.tfrecord', not a"),
        ({"TFDS_NAME": "wikipedia/20230601.en"}, "set DATA (TFRecords) or TFDS_NAME (a TFDS"),
        ({"DATA": None, "TFDS_NAME": "wiki"}, "set TFDS_DATA_DIR (gs://BUCKET/tfds, the data"),
        ({"COMPILE_CHECK": "1"}, "set ACCELERATOR (the slice's accelerator type for COMPILE"),
    ],
)
def test_run_pretraining_checks_its_inputs(tmp_path, env, message):
    launch = Launch(tmp_path)
    result = launch("run_pretraining.sh", **{"WORKDIR": "gs://bkt/w", "DATA": TRAIN_DATA, **env})
    assert result.returncode == 1
    assert result.stderr.startswith(f"run_pretraining.sh: error: {message}"), result.stderr
    assert result.stderr.count("\n") == 1 and launch.calls() == []


@pytest.mark.parametrize("fits", [True, False])
def test_compile_check_runs_first_and_stops_a_config_that_does_not_fit(tmp_path, fits):
    launch = Launch(tmp_path, workers=1)
    _worker_venvs(launch)
    compile_log = tmp_path / "compile.jsonl"
    env = {"WORKDIR": "gs://bkt/w", "DATA": TRAIN_DATA, "COMPILE_CHECK": "1"}
    env |= {"ACCELERATOR": "v4-32", "PYTHON": str(tmp_path / "bin" / "python-local")}
    env |= {"FAKE_COMPILE_LOG": str(compile_log), "FAKE_COMPILE_RC": "0" if fits else "1"}
    result = launch("run_pretraining.sh", "--config.model.dtype=bfloat16", **env)
    (record,) = _records(compile_log)
    assert record["argv"] == [
        "-m",
        "bertjax.compile",
        "--config=configs/large.py",
        "--topology=v4-32",
        "--config.model.dtype=bfloat16",
    ]
    assert record["cwd"] == str(REPO)
    if fits:
        assert result.returncode == 0, result.stderr
        assert [argv[3] for argv in launch.argvs()] == ["ssh"]
    else:
        assert result.returncode == 1 and launch.calls() == []
        assert result.stderr.splitlines()[-1].startswith(
            "run_pretraining.sh: error: compile check failed: configs/large.py does not fit v4-32"
        )


def test_tail_logs_shows_worker_0_or_every_worker(tmp_path):
    launch = Launch(tmp_path, workers=2)
    for home in launch.homes:
        (home / "bertjax-logs").mkdir()
        (home / "bertjax-logs" / "r1.log").write_text("step 1\nstep 2\nstep 3\n")
        (home / "bertjax-logs" / "latest.log").symlink_to("r1.log")
    result = launch("tail_logs.sh", LINES="2")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "step 2\nstep 3\n"
    assert launch.argvs()[0][:6] == [*SSH, "--worker=0"]
    every = launch("tail_logs.sh", WORKER="all", RUN_NAME="r1")
    assert every.stdout.splitlines() == [f"w{i}: step {s}" for i in range(2) for s in (1, 2, 3)]
    assert "--worker=all" in launch.argvs()[1]
    follow = launch("tail_logs.sh", FOLLOW="1", DRY_RUN="1")
    assert "tail -n 50 -F $HOME/bertjax-logs/latest.log" in shlex.split(follow.stdout)[-2]


def test_delete_forces_the_queued_resource_and_its_nodes(tmp_path):
    launch = Launch(tmp_path)
    assert launch("delete_tpu_vm.sh").returncode == 0
    assert launch("delete_tpu_vm.sh", ASYNC="1", PROJECT="p").returncode == 0
    delete = ["compute", "tpus", "queued-resources", "delete", "bert-pod", "--force", "--quiet"]
    assert launch.argvs() == [
        [*delete, f"--zone={ZONE}"],
        [*delete, "--async", f"--zone={ZONE}", "--project=p"],
    ]


DATAFLOW = {
    "PROJECT": "proj", "REGION": "us-central1", "INPUT": "gs://bkt/corpus/*.txt.gz",
    "OUTPUT": "gs://bkt/tfrecords/train.tfrecord", "VOCAB": "gs://bkt/vocab.txt",
}  # fmt: skip
VERSION = next(
    line.split("=")[1].strip()
    for line in (REPO / "setup.cfg").read_text().splitlines()
    if line.startswith("version")
)


@pytest.mark.parametrize(
    "given, defaults",
    [
        ({}, ["--work_unit_bytes=268435456"]),  # docs/benchmarks.md: memory flat up to 256 MiB
        ({"MACHINE_TYPE": "n2-x", "DISK_GB": "30", "units": ["--work_unit_bytes=1000"]}, []),
    ],
    ids=["defaults", "given"],
)
def test_dataflow_builds_an_sdist_and_runs_the_builder_on_dataflow(tmp_path, given, defaults):
    launch = Launch(tmp_path)
    flags = [
        "--num_output_shards=8",
        "--dupe_factor=10",
        "--pack_sequences",
        *given.pop("units", []),
    ]
    env = {**DATAFLOW, "PYTHON": "python-local", "JOB_NAME": "job-1", "MAX_WORKERS": "50", **given}
    result = launch("create_data_dataflow.sh", *flags, **env)
    assert result.returncode == 0, result.stderr
    build, builder = _records(tmp_path / "python.jsonl")
    dist = build["argv"][4]
    assert build["argv"] == ["-m", "build", "--sdist", "--outdir", dist, str(REPO)]
    machine = given.get("MACHINE_TYPE", "n2-standard-4")  # over twice a worker's measured peak
    options = (
        "--project=proj --region=us-central1 --temp_location=gs://bkt/dataflow --job_name=job-1 "
        f"--extra_package={dist}/bertjax-{VERSION}.tar.gz --max_num_workers=50 "
        f"--worker_machine_type={machine} --disk_size_gb={given.get('DISK_GB', '250')}"
    )  # a unit's pieces and a shard are spooled on the worker's disk
    assert builder["argv"] == [
        "-m", "bertjax.create_pretraining_data", "--runner=DataflowRunner",
        f"--beam_pipeline_options={options}", "--input_file=gs://bkt/corpus/*.txt.gz",
        "--output_file=gs://bkt/tfrecords/train.tfrecord", "--vocab_file=gs://bkt/vocab.txt",
        *defaults, *flags,
    ]  # fmt: skip
    assert not pathlib.Path(dist).exists()  # the sdist's directory is removed
    assert launch.calls() == []  # no gcloud: Beam's Dataflow runner submits the job


def test_vocab_on_dataflow_builds_an_sdist_and_runs_the_vocab_builder(tmp_path):
    launch = Launch(tmp_path)
    flags = ["--vocab_size=30522", "--num_unused=994"]
    env = {**DATAFLOW, "OUTPUT": "gs://bkt/vocab/vocab.txt", "PYTHON": "python-local"}
    env.update(VOCAB=None, MACHINE_TYPE="n2-x")
    result = launch("create_vocab_dataflow.sh", *flags, **env)
    assert result.returncode == 0, result.stderr
    build, builder = _records(tmp_path / "python.jsonl")
    dist = build["argv"][4]
    assert build["argv"] == ["-m", "build", "--sdist", "--outdir", dist, str(REPO)]
    options = shlex.split(_flag(builder["argv"], "--beam_pipeline_options"))
    assert options[:3] == [
        "--project=proj",
        "--region=us-central1",
        "--temp_location=gs://bkt/dataflow",
    ]
    assert re.fullmatch(r"--job_name=bertjax-vocab-\d{8}-\d{6}", options[3])
    assert options[4:] == [
        f"--extra_package={dist}/bertjax-{VERSION}.tar.gz",
        "--worker_machine_type=n2-x",
    ]
    assert builder["argv"] == [
        "-m", "bertjax.vocab", "--runner=DataflowRunner", builder["argv"][3],
        "--input_file=gs://bkt/corpus/*.txt.gz", "--output_file=gs://bkt/vocab/vocab.txt", *flags,
    ]  # fmt: skip
    assert not pathlib.Path(dist).exists()
    assert launch.calls() == []


def test_dataflow_dry_run_prints_both_commands_and_runs_none(tmp_path):
    launch = Launch(tmp_path)
    result = launch("create_data_dataflow.sh", DRY_RUN="1", JOB_NAME="job-2", **DATAFLOW)
    assert result.returncode == 0, result.stderr
    lines = [shlex.split(line) for line in result.stdout.splitlines()]
    assert [words[:3] for words in lines] == [["+", "python3", "-m"]] * 2
    assert lines[0][3] == "build" and lines[1][3] == "bertjax.create_pretraining_data"
    assert "--job_name=job-2" in _flag(lines[1], "--beam_pipeline_options")
    assert not (tmp_path / "python.jsonl").exists()


@pytest.mark.parametrize(
    "env, args, message",
    [
        ({"OUTPUT": "/tmp/out.tfrecord"}, [], "OUTPUT has '/tmp/out.tfrecord', not a gs:// path"),
        ({"INPUT": "gs://bkt/a.txt,b.txt"}, [], "INPUT has 'b.txt', not a gs:// path"),
        ({"JOB_NAME": "Job_1"}, [], "JOB_NAME=Job_1: Dataflow takes lower-case letters"),
        ({}, ["--vocab_file=v.txt"], "--vocab_file comes from the variables"),
        ({}, ["--runner", "x"], "--runner comes from the variables"),
        ({"SCRIPT": "create_vocab_dataflow.sh"}, ["--output_file=v"], "--output_file comes from"),
        ({"SCRIPT": "create_vocab_dataflow.sh", "OUTPUT": "v.txt"}, [], "OUTPUT has 'v.txt', not"),
    ],
)
def test_dataflow_bad_settings_are_one_line(tmp_path, env, args, message):
    launch = Launch(tmp_path)
    script = env.pop("SCRIPT", "create_data_dataflow.sh")
    result = launch(script, *args, **{**DATAFLOW, **env})
    assert result.returncode == 1
    assert result.stderr == f"{script}: error: {result.stderr.split('error: ')[1]}"
    assert message in result.stderr and result.stderr.count("\n") == 1


def test_shellcheck_passes():
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    scripts = sorted(str(p) for p in (REPO / "launch").glob("*.sh"))
    result = subprocess.run([shellcheck, "-x", *scripts], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
