"""End-to-end: ``python -m bertjax.main`` as subprocesses on a slice of the bundled corpus.

One uninterrupted reference run (made once per session and shared with faults_test:
``tests/commands/tiny_run.py``), then the same command killed with SIGKILL (aimed at an async
save, and twice between orbax's commit of a step and its seal: at the shipped ``keep`` and at
``keep=1``), resumed and stopped with SIGTERM, resumed to the end: its parameters must be
bit-identical to the reference (CPU, fp32); a rerun takes over the lease its killed holder left,
and a second run is refused while the first holds it. Two processes with ``jax.distributed``
(gloo) must match one; they stop together, with no device collective per step, through JAX's
preemption sync point: SIGTERM to one process or to both saves the same step on both and exits
0, and the run resumes bit-identical to an uninterrupted run on two devices (one process: the
same two shards of each batch and the same two-term sums, so bit-identical to two processes,
for a third of their start-up); a lease lost by process 0 stops both with one line. Runs
that stop with an error before their devices compute, and the attention self-check's two short
runs (one with a wrong kernel patched in), run in this process (``tiny_run.call``). All runs
share a persistent compilation cache so only the first one pays for compiling, and all but the
reference fork from the suite's zygote (``tests/zygote.py``), so none pays for its imports.
"""

import dataclasses
import json
import pathlib
import re
import signal
import socket
import subprocess
import time

import numpy as np
import pytest

from bertjax.data import bundled
from bertjax.training import lease, lease_stores
from bertjax.training import workdir as workdir_lib
from tests import cpu_xla, zygote
from tests.commands import tiny_run as tiny_run_lib

pytestmark = pytest.mark.xdist_group("main_test")
REPO, NUM_STEPS = tiny_run_lib.REPO, tiny_run_lib.NUM_STEPS
_overrides, _command, _run = tiny_run_lib.overrides, tiny_run_lib.command, tiny_run_lib.run
_call = tiny_run_lib.call


@pytest.fixture(scope="module")
def env(tiny_run):
    """(root, corpus, environ) of the shared tiny run (``tests/commands/tiny_run.py``)."""
    return tiny_run.env


@pytest.fixture(scope="module")
def reference(tiny_run):
    """(workdir, stdout, stderr) of its uninterrupted run, made once per session."""
    return tiny_run.reference


def test_start_up_is_quiet_on_a_cpu_machine(reference):
    """No CUDA/TPU probing lines (libtpu is installed by the test extra) and no line twice."""
    _, stdout, stderr = reference
    lines = [line for line in (stdout + stderr).splitlines() if line.strip()]
    noise = re.compile(r"cuda|cuInit|TPU|libtpu|oneDNN|InitializeLog|cpu_feature_guard", re.I)
    assert not [line for line in lines if noise.search(line)], stderr[-3000:]
    assert len(lines) == len(set(lines)), [line for line in lines if lines.count(line) > 1]


def test_reference_run_logs_evaluates_and_exports(reference):
    workdir, stdout, _ = reference
    lines = [line for line in stdout.splitlines() if line.startswith("step ")]
    assert len(lines) == NUM_STEPS
    for field in (
        "loss",
        "mlm_loss",
        "mlm_acc",
        "nsp_loss",
        "nsp_acc",
        "lr",
        "grad_norm",
        "seq/s",
        "tok/s",
        "gflop/s/dev",
        "input_wait",
        "host",
        "eta",
    ):
        assert f" {field} " in lines[-1], lines[-1]
    assert re.search(r" host [\d.]+[kM]?/s/core eta ", lines[-1]), lines[-1]
    train = json.loads(stdout.split("final summary: ")[1].splitlines()[0])["train"]
    # The pipeline's work on the window's rows: tens of thousands of tiny rows per core-second.
    assert train["host_rate"] > 1000 and 0 < train["host_cores"] < 1, train
    assert re.search(r"^eval step 8 mlm_loss \S+ mlm_accuracy", stdout, re.M)
    assert "final summary:" in stdout
    assert re.search(r"^mfu: no known peak for 'cpu'", stdout, re.M)  # and no MFU on CPU
    assert list((workdir / "tensorboard").glob("events.out.tfevents.*"))
    params, bert_config, vocab_file, do_lower_case = workdir_lib.latest_params(workdir)
    assert set(params) == {"encoder", "pooler", "mlm", "nsp"}
    assert "layer_1" in params["encoder"]["layers"] and bert_config.hidden_size == 32
    assert (
        do_lower_case
        and pathlib.Path(vocab_file).read_text()
        == pathlib.Path(bundled.bundled_paths().vocab).read_text()
    )


def _wait_for(proc, predicate, timeout=240):
    start = time.time()
    while time.time() - start < timeout:
        if predicate():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.002)
    return False


def _killed_between_commit_and_seal(env, workdir, step: int, *extra, while_held=None) -> str:
    """Runs the command with ``step``'s seal held (``tests/held_seal.py``) and kills it with
    SIGKILL there: orbax has committed the step, bertjax has not sealed it. ``while_held(pid)``
    runs while it is held (the run alive, holding the workdir). Returns stdout and stderr."""
    _, corpus, environ = env
    marker = workdir.parent / f"{workdir.name}-seal-{step}-held"
    marker.unlink(missing_ok=True)
    command = _command(corpus, workdir, *extra)
    command[1:3] = ["-m", "tests.held_seal", str(step), str(marker), "bertjax.main"]
    proc = zygote.popen(command, env=environ, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    held = _wait_for(proc, marker.exists)
    step_dir = workdir / "checkpoints" / str(step)
    window = step_dir.is_dir() and not (step_dir / "bertjax_manifest.json").exists()
    try:
        if held and while_held is not None:
            while_held(proc.pid)
    finally:
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    assert held and window and proc.returncode == -9, err[-3000:]
    return out + err


def _refused(env, workdir):
    """A second run on ``workdir`` while process ``pid`` holds it: one line naming the holder."""

    def check(pid):
        result = _call(env, workdir, "--config.optimizer.learning_rate=0.001")
        assert result.returncode == 1, result.stderr[-3000:]
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("main: error: "), result.stderr[-3000:]
        assert f"{workdir} is in use by host " in lines[0] and f" pid {pid} since " in lines[0]

    return check


def test_kill_9_mid_save_and_between_commit_and_seal_then_sigterm_then_resume_is_bit_identical(
    env, reference
):
    """The one local kill test of pretraining (gs://: tests/gcs/pretraining_test.py). Each kill
    is aimed: mid-save, then between orbax's commit of a step and its seal at the shipped
    ``keep`` (configs/tiny.py: 2) and at ``keep=1``, where the newest sealed step must survive
    (``bertjax.training.retention``); then SIGTERM, then the run to its end. The first rerun
    takes over the lease the killed run left; while the second is held, a run of another
    command line on the workdir is refused naming its holder (faults_test has SIGINT's). The
    last two run at ``keep=1, keep_every=4``: step 4 outlives the preemption save."""
    _, corpus, environ = env
    workdir = env[0] / "interrupted"
    ckpt_dir = workdir / "checkpoints"
    # 1) SIGKILL the moment a checkpoint directory is being written (orbax's temporary name).
    proc = zygote.popen(
        _command(corpus, workdir),
        env=environ,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    in_save = lambda: ckpt_dir.exists() and any("tmp" in p.name for p in ckpt_dir.iterdir())
    assert _wait_for(proc, in_save)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # 2) At the shipped keep: step 2 sealed, step 4 committed but not sealed. The killed run's
    # lease is still there: this run takes it over (its holder's pid is dead).
    out = _killed_between_commit_and_seal(env, workdir, 4)
    assert f"taking over the lease of {workdir} from host " in out, out[-3000:]
    # 3) keep=1: the rerun restores step 2, saves and seals 4 (which lets 2 go), and is killed
    # with 6 committed but not sealed. Step 4 must still be there and verify.
    out = _killed_between_commit_and_seal(env, workdir, 6, "--config.checkpoint.keep=1",
                                          while_held=_refused(env, workdir))  # fmt: skip
    assert "checkpoint step 4: no manifest (incomplete save); trying step 2" in out, out
    assert f"restored step 2 from {ckpt_dir}" in out, out
    # 4) Resume; SIGTERM after the first logged step -> checkpoint at the current step, exit 0.
    # keep_every=4: step 4 is kept for good, though the preemption save counts in keep=1.
    kept_for_good = ("--config.checkpoint.keep=1", "--config.checkpoint.keep_every=4")
    log = open(env[0] / "sigterm_stderr.txt", "w")  # noqa: SIM115 - read back on failure
    proc = zygote.popen(
        _command(corpus, workdir, *kept_for_good),
        env=environ,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    before = []
    for line in proc.stdout:
        before.append(line)
        if line.startswith("step "):
            proc.send_signal(signal.SIGTERM)
            break
    proc.stdout.read()
    returncode = proc.wait(timeout=120)
    log.close()
    assert returncode == 0, (env[0] / "sigterm_stderr.txt").read_text()[-3000:]
    assert f"restored step 4 from {ckpt_dir}\n" in before, before
    stopped_at = int(line.split()[1].split("/")[0])
    steps = sorted(int(p.name) for p in ckpt_dir.iterdir() if p.name.isdigit())
    assert steps and steps[-1] >= stopped_at
    assert 4 in steps, steps
    # 5) Resume to the end: the newest step and the multiples of keep_every are left.
    result = _run(env, workdir, *kept_for_good)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "restored step" in result.stdout
    assert sorted(int(p.name) for p in ckpt_dir.iterdir() if p.name.isdigit()) == [4, 8]
    got, *_ = workdir_lib.latest_params(workdir)
    want, *_ = workdir_lib.latest_params(reference[0])
    flat = lambda tree: {k: v for k, v in _flatten(tree)}
    for key, value in flat(want).items():
        np.testing.assert_array_equal(flat(got)[key], value, err_msg=key)
    assert not (workdir / lease.LEASE_FILE).exists()  # released at the end


def _flatten(tree, prefix=""):
    for k, v in tree.items():
        if isinstance(v, dict):
            yield from _flatten(v, f"{prefix}{k}/")
        else:
            yield f"{prefix}{k}", np.asarray(v)


def _two_processes(env, workdir, *extra):
    """``python -m bertjax.main`` as processes 0 and 1 of one run (gloo on localhost)."""
    _, corpus, environ = env
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    flags = (f"--coordinator_address=localhost:{port}", "--num_processes=2")
    return [
        zygote.popen(
            _command(corpus, workdir, *flags, f"--process_id={i}", *extra),
            env=environ,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]


def _finish(procs, timeout=400) -> list[tuple[str, str]]:
    outputs = [p.communicate(timeout=timeout) for p in procs]
    return [(out or "", err) for out, err in outputs]


@pytest.fixture(scope="module")
def two_device_reference(env):
    """An uninterrupted run on two devices of one process: what two processes compute."""
    root, corpus, environ = env
    environ = cpu_xla.environ(2, environ)
    workdir = root / "two_devices"
    result = _run((root, corpus, environ), workdir, NO_EVAL)
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


def _signal_after_first_step(procs, targets, signum=signal.SIGTERM) -> str:
    """Sends ``signum`` to ``procs[i]`` for i in ``targets`` once process 0 has logged step 1;
    returns process 0's whole stdout."""
    lines = []
    for line in procs[0].stdout:
        lines.append(line)
        if line.startswith("step 1/"):
            for i in targets:
                procs[i].send_signal(signum)
            break
    lines.append(procs[0].stdout.read())
    return "".join(lines)


def _saved_step(stdout: str, workdir) -> int:
    """The step process 0 announced saving, checked against the newest checkpoint on disk."""
    match = re.search(r"^preemption notice .*: saving step (\d+)$", stdout, re.M)
    assert match, stdout[-3000:]
    step = int(match[1])
    assert max(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == step
    return step


# A save every step makes each step slow (it waits for the previous save), so that JAX's notifier,
# which polls for SIGTERM once a second, sees it well before step 8; saves change nothing trained.
SLOW_STEPS = "--config.checkpoint.every_steps=1"
NO_EVAL = "--config.train.eval_every=0"  # the multi-process runs test stopping, not evaluation


def test_sigterm_to_one_process_saves_one_step_on_both_and_resumes_bit_exact(
    env, two_device_reference, reference
):
    """Stopped by SIGTERM to process 1 only, resumed to the end: bit-identical to an uninterrupted
    run on two devices, and within float32 rounding of one device's (two processes match one)."""
    workdir = env[0] / "preempted"
    procs = _two_processes(env, workdir, SLOW_STEPS, NO_EVAL)
    stdout = _signal_after_first_step(procs, targets=[1])
    outputs = _finish(procs)
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err[-3000:]
    stopped = _saved_step(stdout, workdir)
    assert 1 <= stopped < NUM_STEPS and "final summary" not in stdout
    procs = _two_processes(env, workdir, NO_EVAL)  # resume to the end
    outputs = _finish(procs)
    for p, (out, err), process in zip(procs, outputs, range(2), strict=True):
        assert p.returncode == 0 and "Traceback" not in err, (process, err[-3000:])
        assert f"restored step {stopped} " in out + err, (process, err[-3000:])
    assert "final summary" in outputs[0][0]
    got, *_ = workdir_lib.latest_params(workdir)
    want, *_ = workdir_lib.latest_params(two_device_reference)
    for (key, a), (_, b) in zip(_flatten(got), _flatten(want), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=key)
    one, *_ = workdir_lib.latest_params(reference[0])
    for (key, a), (_, b) in zip(_flatten(got), _flatten(one), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=key)


def test_sigterm_to_both_processes_saves_one_step_and_exits_0(env):
    workdir = env[0] / "both"
    procs = _two_processes(env, workdir, "--config.train.num_steps=1000", NO_EVAL)
    stdout = _signal_after_first_step(procs, targets=[0, 1])
    outputs = _finish(procs)
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err[-3000:]
    assert _saved_step(stdout, workdir) >= 1
    assert stdout.count("saving step") == 1


def test_a_lost_lease_stops_both_processes_with_one_line(env):
    workdir = env[0] / "lease"
    procs = _two_processes(
        env,
        workdir,
        "--config.train.num_steps=1000",
        NO_EVAL,
        "--config.checkpoint.lease_ttl_seconds=1",
        "--config.checkpoint.lease_renew_seconds=0.1",
    )
    for line in procs[0].stdout:
        if line.startswith("step 1/"):  # another run takes the workdir over
            store = lease_stores.LocalStore(workdir)
            intruder = dataclasses.replace(
                lease.LeaseRecord.from_bytes(store.read().data, "test"),
                host="other-host", pid=4242, token="intruder", renewed=time.time(),
            )  # fmt: skip
            store.replace(intruder.to_bytes(), store.read().version)
            break
    outputs = _finish(procs)
    for p, (_, err), process in zip(procs, outputs, range(2), strict=True):
        assert p.returncode == 1, (process, err[-3000:])
        assert "Traceback" not in err
        last = err.strip().splitlines()[-1]
        assert re.fullmatch(r"main: error: .*: this run lost its lease .*", last), last
    assert "taken over by host other-host pid 4242" in outputs[0][1]
    assert json.loads((workdir / lease.LEASE_FILE).read_text())["token"] == "intruder"


def test_bad_config_is_one_line_error(env):
    result = _call(env, env[0] / "bad", "--config.data.max_seq_length=64")
    assert result.returncode == 1
    assert "error: config.data.max_seq_length=64 exceeds" in result.stderr
    assert "Traceback" not in result.stderr


def test_nonfinite_loss_stops_naming_the_step_without_saving_it(env):
    # Step 1 applies a 1e30-sized update (no warmup); step 2's forward pass overflows. In this
    # process (8 fake devices, XLA at -O0 as the subprocesses): two steps, no start-up of its own.
    workdir = env[0] / "nan"
    result = _call(
        env,
        workdir,
        "--config.optimizer.learning_rate=1e30",
        "--config.optimizer.warmup_steps=0",
        "--config.optimizer.max_grad_norm=0",
    )
    assert result.returncode == 1
    assert "error: non-finite loss or gradient at step 2" in result.stderr
    steps = [p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    assert steps == [], steps  # step 2 (a checkpoint step) was not saved


@pytest.fixture(scope="module")
def self_check_runs(env):
    """--config.model.attention_impl=fused, 2 steps, in this process (``tiny_run.call``: its 8
    fake devices), with the kernel as it is and with the TPU kernel (interpret mode on CPU) with
    its output scaled, wrong by 2%: {wrong: (workdir, exit status, stdout, stderr)}. Before
    each, what a fresh process starts with: no check run (kernel_check's outcomes) and no trace
    of the kernel."""
    import jax  # noqa: PLC0415

    from bertjax.model.attention import tpu  # noqa: PLC0415
    from bertjax.training import kernel_check  # noqa: PLC0415

    flash_attention, runs = tpu.flash_attention, {}
    for wrong in (False, True):
        workdir = env[0] / f"self_check_{wrong}"
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(kernel_check, "_outcomes", {})
            patch.setattr(kernel_check, "_decisions", {})
            if wrong:
                scaled = lambda *args, **kwargs: flash_attention(*args, **kwargs) * 1.02  # noqa: E731
                patch.setattr(tpu, "flash_attention", scaled)
            jax.clear_caches()
            result = _call(env, workdir, "--config.model.attention_impl=fused",
                           "--config.train.num_steps=2", "--config.train.eval_every=0")  # fmt: skip
            jax.clear_caches()  # no trace of the wrong kernel for later tests
        runs[wrong] = (workdir, result.returncode, result.stdout, result.stderr)
    return runs


@pytest.mark.parametrize("wrong", [True, False], ids=["wrong_kernel", "kernel"])
def test_attention_self_check_falls_back_to_xla_with_one_line_and_a_record(self_check_runs, wrong):
    """--config.model.attention_impl=fused: a wrong kernel makes the run use 'xla' (one warning
    line naming the largest difference, written down in the workdir's record); the kernel as it
    is passes and the run uses it."""
    workdir, code, stdout, stderr = self_check_runs[wrong]
    assert code == 0, stderr[-3000:]
    output = stdout + stderr
    warnings = [line for line in output.splitlines() if "attention self-check" in line]
    record = json.loads((workdir / workdir_lib.META_FILE).read_text())["attention_check"]
    if wrong:
        assert len(warnings) == 1 and warnings[0].startswith("WARNING: "), warnings
        assert "differs from the float32 truth by" in warnings[0], warnings
        assert (record["runs"], record["passed"]) == ("xla", False)
    else:
        assert warnings == [], warnings
        assert (record["runs"], record["passed"]) == ("tpu_interpret", True)
    assert record["kernel"] == "tpu_interpret" and record["head_dim"] == 16
    # Checked at the run's shapes: L = 32; the gathered last layer's [CLS] + 5 masked positions.
    assert (record["length"], record["queries"], record["packed"]) == (32, 6, 0)
    assert len([line for line in stdout.splitlines() if line.startswith("step ")]) == 2
