"""Runs that cannot be lost: ``python -m bertjax.main`` against the faults users meet.

Every case drives the real command on the tiny model (main_test's set-up, 8 steps, a checkpoint
every 2) and checks what the run does and what the workdir holds afterwards:

1. a second run on a live workdir is refused naming the holder; SIGINT then saves and exits 0
   as SIGTERM does (in 3's test: its allowed run is the live holder that gets SIGINT);
2. a damaged or incomplete latest checkpoint is named and skipped, the run resumes from the
   newest step that verifies and ends bit-identical to an uninterrupted run; convert too;
3. a --config.data.vocab_file that differs from the init_checkpoint's vocab in size or content
   is refused naming both files, unless config.allow_vocab_change;
4. a rejected resume (another model) leaves the workdir byte-identical;
5. a full disk stops the run with one line; the last complete checkpoint resumes bit-identical;
6. SIGTERM during start-up is one line.

Runs refused before their devices compute anything (1, 2, 3, 4) run in this process
(``tiny_run.call``); the others are processes. A dead holder's lease taken over, and kill -9
aimed mid-save and between a step's commit and its seal, are main_test's
``test_kill_9_mid_save_and_between_commit_and_seal_...`` (one run, no second reference).
"""

import hashlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bertjax.data import bundled
from bertjax.training import checkpoint
from bertjax.training import workdir as workdir_lib
from tests import zygote
from tests.commands.main_test import NUM_STEPS, REPO, _command, _flatten, _run, env, reference
from tests.commands.tiny_run import call

pytestmark = pytest.mark.xdist_group("faults_test")  # its own reference run, one worker
__all__ = ["env", "reference"]  # main_test's fixtures, instantiated for this module


def _start(env, workdir, *extra, stdout=subprocess.PIPE):
    _, corpus, environ = env
    return zygote.popen(
        _command(corpus, workdir, *extra),
        env=environ,
        cwd=REPO,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
    )


def _until_step(proc) -> int:
    """Reads the run's stdout up to its first step line; returns that step."""
    for line in proc.stdout:
        if line.startswith("step "):
            return int(line.split()[1].split("/")[0])
    raise AssertionError(proc.stderr.read()[-3000:])


def _lines_until_step(proc) -> str:
    """The run's stdout up to and with its first step line."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("step "):
            return "".join(lines)
    raise AssertionError(proc.stderr.read()[-3000:])


def _one_line_error(result) -> str:
    assert result.returncode == 1, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def _assert_same_params(workdir, reference):
    got, *_ = workdir_lib.latest_params(workdir, log=lambda _: None)
    want, *_ = workdir_lib.latest_params(reference[0], log=lambda _: None)
    got = dict(_flatten(got))
    for key, value in _flatten(want):
        np.testing.assert_array_equal(got[key], value, err_msg=key)


def _snapshot(path) -> dict:
    return {
        p.relative_to(path): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def _largest_file(step_dir):
    return max((p for p in (step_dir / "state").rglob("*") if p.is_file()),
               key=lambda p: p.stat().st_size)  # fmt: skip


def test_2_damaged_checkpoints_are_named_skipped_or_stop_the_run(env, reference, tmp_path):
    """The latest step with 4 KiB overwritten (size unchanged) and an empty newer step directory:
    both named, the run resumes from the step before and ends bit-identical to the reference.
    With every step damaged (metadata deleted, data truncated) nothing starts."""
    workdir = tmp_path / "run"
    shutil.copytree(reference[0], workdir)
    data = _largest_file(workdir / "checkpoints" / str(NUM_STEPS))
    with open(data, "r+b") as f:
        f.seek(data.stat().st_size // 2)
        f.write(bytes(4096))
    (workdir / "checkpoints" / str(NUM_STEPS + 2)).mkdir()
    result = _run(env, workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert f"checkpoint step {NUM_STEPS + 2}: empty directory (incomplete save); trying" in out
    assert f"checkpoint step {NUM_STEPS} failed verification: state/" in out
    assert "checksum differs: expected crc32c " in out and f"trying step {NUM_STEPS - 2}" in out
    assert f"restored step {NUM_STEPS - 2} " in out
    _assert_same_params(workdir, reference)
    broken = tmp_path / "broken"
    shutil.copytree(reference[0], broken)
    (broken / "checkpoints" / str(NUM_STEPS) / "meta" / "metadata").unlink()
    data = _largest_file(broken / "checkpoints" / str(NUM_STEPS - 2))
    data.write_bytes(data.read_bytes()[:-4096])
    before = _snapshot(broken)
    line = _one_line_error(call(env, broken))
    assert "no checkpoint verifies" in line and "nothing was started" in line
    assert _snapshot(broken) == before


def test_2_convert_exports_the_newest_verified_step(env, reference, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(reference[0], workdir)
    (workdir / "checkpoints" / str(NUM_STEPS + 2)).mkdir()  # incomplete: skipped with a notice
    result = zygote.run(
        [sys.executable, "-m", "bertjax.convert", f"--src={workdir}", f"--dst={tmp_path}/hf",
         "--to=hf"], capture_output=True, text=True, cwd=REPO, env=env[2], timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "empty directory (incomplete save); trying step" in result.stdout
    assert (tmp_path / "hf" / "model.safetensors").exists()


def _params_checkpoint(reference, tmp_path, vocab_lines, name):
    """The reference run's params as a params-only checkpoint with the given vocab."""
    params, bert_config, _, _ = workdir_lib.latest_params(reference[0], log=lambda _: None)
    rows = len(vocab_lines)
    embeddings = params["encoder"]["embeddings"]["word_embeddings"]
    embeddings["embedding"] = embeddings["embedding"][:rows]
    params["mlm"]["output_bias"] = params["mlm"]["output_bias"][:rows]
    vocab = tmp_path / f"{name}.txt"
    vocab.write_text("\n".join(vocab_lines) + "\n")
    config = bert_config.replace(vocab_size=rows)
    return checkpoint.save_params(tmp_path / name, params, config, str(vocab), True)


def test_3_init_vocab_must_be_the_datas_and_1_a_live_run_refuses_a_second_and_saves_on_sigint(
    env, reference, tmp_path
):
    """3, then 1 with 3's allowed run as the live holder that gets SIGINT."""
    lines = open(bundled.VOCAB).read().splitlines()
    small = _params_checkpoint(reference, tmp_path, lines[:1000], "small")
    vocab = f"--config.data.vocab_file={bundled.VOCAB}"  # else the checkpoint's vocab is used
    line = _one_line_error(call(env, tmp_path / "a", f"--config.init_checkpoint={small}", vocab))
    assert "sizes differ" in line
    assert "1000" in line and "7633" in line and str(small) in line
    shuffled = _params_checkpoint(reference, tmp_path, [*lines[:5], *lines[6:], lines[5]], "shuf")
    line = _one_line_error(call(env, tmp_path / "b", f"--config.init_checkpoint={shuffled}", vocab))
    assert f"{shuffled}/vocab.txt" in line and bundled.VOCAB in line
    assert "same size (7633 entries), different content" in line
    assert not (tmp_path / "b").exists()  # refused before anything was written
    # Allowed: the run that 1) needs, a live holder of its workdir, stopped by SIGINT.
    workdir = tmp_path / "c"
    allowed = ("--config.allow_vocab_change=True", "--config.train.num_steps=100000")
    first = _start(env, workdir, f"--config.init_checkpoint={shuffled}", vocab, *allowed)
    loaded = f"init_checkpoint {shuffled} (bertjax): loaded encoder, pooler, mlm, nsp"
    assert loaded in _lines_until_step(first)
    stopped_at = _until_step(first)  # a second step: it trains
    # 1) A second run on the live workdir is refused, naming the holder.
    second = call(env, workdir, "--config.optimizer.learning_rate=0.001")
    line = _one_line_error(second)
    assert f"{workdir} is in use by host " in line and f" pid {first.pid} since " in line
    # 1) SIGINT saves and exits 0 as SIGTERM does.
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "SIGINT: saving step" in out
    saved = max(int(p.name) for p in (workdir / "checkpoints").iterdir())
    assert saved >= stopped_at
    assert not (workdir / "bertjax_lease.json").exists()  # released at the end


def test_4_rejected_resume_leaves_the_workdir_byte_identical(env, reference, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(reference[0], workdir)
    before = _snapshot(workdir)
    line = _one_line_error(call(env, workdir, "--config.model.num_layers=3"))
    assert "holds a run of another model (config.model.num_layers 2 -> 3)" in line
    assert _snapshot(workdir) == before
    workdir_lib.latest_params(workdir, log=lambda _: None)  # still exports


def test_5_full_disk_stops_with_one_line_and_the_last_checkpoint_resumes(env, reference, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(disk)],
                             capture_output=True)  # fmt: skip
    if mounted.returncode:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        result = _run(env, disk / "run")
        line = _one_line_error(result)
        assert line.startswith("main: error: checkpoint step 4 needs about ")
        assert f"in {disk}/run/checkpoints" in line and "the run stopped before saving" in line
        assert line.endswith("the last complete checkpoint, step 2, is kept")
        steps = [int(x.split()[1].split("/")[0]) for x in result.stdout.splitlines()
                 if x.startswith("step ")]  # fmt: skip
        assert steps and steps[-1] < NUM_STEPS
        shutil.copytree(disk / "run", tmp_path / "moved")
    finally:
        subprocess.run(["umount", str(disk)], check=True)
    result = _run(env, tmp_path / "moved")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "restored step 2 " in result.stdout  # the one complete save (5 MB: one fits)
    _assert_same_params(tmp_path / "moved", reference)


def test_6_sigterm_in_start_up_is_one_line(env, tmp_path):
    early = _start(env, tmp_path / "early")
    _wait_until_it_catches(early.pid, signal.SIGTERM)  # cli.run's handler: before the config loads
    early.send_signal(signal.SIGTERM)
    _, err = early.communicate(timeout=300)
    assert early.returncode == 1
    assert err.strip().splitlines() == ["main: stopped by SIGTERM before anything was saved"]


def _wait_until_it_catches(pid: int, signum: int, timeout: float = 60.0) -> None:
    """Polls /proc/PID/status until the process catches ``signum`` (its SigCgt bit mask)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        status = open(f"/proc/{pid}/status").read()
        caught = int(status.split("SigCgt:")[1].split()[0], 16)
        if caught >> (signum - 1) & 1:
            return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} never installed a handler for signal {signum}")
