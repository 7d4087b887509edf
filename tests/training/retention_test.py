"""Checkpoint retention (``bertjax.training.retention``): the invariant that, after the first
seal, some step always verifies, for every ``keep``, async and sync saves.

The window that matters is between orbax's commit of a step and bertjax's seal of it: each save
here is held at its seal (``write_manifest`` blocks until released) while the test looks at the
directory as a ``kill -9`` at that instant would leave it. A watcher thread checks the invariant
throughout. The commands' kill tests aim ``kill -9`` at the same window
(``tests/commands/faults_test.py``, ``tests/finetune/loop_test.py``, ``tests/gcs/``).
"""

import threading

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bertjax.training import checkpoint_manifest as cm
from bertjax.training import retention, workdir

RNG = np.asarray([1, 2], np.uint32)


def _state(step: int) -> dict:
    return {"w": jnp.full((64, 64), float(step)), "step": jnp.asarray(step, jnp.int32)}


def _verified(directory) -> list[int]:
    """The steps that verify, newest first: a listing, then each step verified in turn."""
    found = []
    try:
        listed = cm.step_dirs(directory)
    except FileNotFoundError:  # a step deleted between the listing and its is_dir()
        listed = cm.step_dirs(directory)
    for step, path in listed:
        try:
            cm.verify(path)
            found.append(step)
        except (cm.CheckpointCorrupt, FileNotFoundError):  # not sealed, or being deleted
            pass
    return found


class _HeldSeals:
    """Makes ``write_manifest`` wait, for each step, until the test releases it."""

    def __init__(self, monkeypatch):
        self.holding, self.release = threading.Event(), threading.Event()
        self.step = None
        write = cm.write_manifest

        def held(step_dir, **kwargs):
            self.step = int(epath_name(step_dir))
            self.holding.set()
            assert self.release.wait(60), "never released"
            self.release.clear()
            return write(step_dir, **kwargs)

        monkeypatch.setattr(cm, "write_manifest", held)

    def wait(self) -> int:
        assert self.holding.wait(60), "no seal started"
        self.holding.clear()
        return self.step


def epath_name(path) -> str:
    return str(path).rstrip("/").rsplit("/", 1)[-1]


class _Watcher(threading.Thread):
    """Checks, as often as it can, that some step verifies once one was sealed."""

    def __init__(self, directory):
        super().__init__(daemon=True)
        self.directory, self.armed, self.done = directory, threading.Event(), threading.Event()
        self.checks, self.violations = 0, []

    def run(self):
        while not self.done.is_set():
            if self.armed.is_set():
                # One pass is not one instant: it can verify the newest step just before its
                # seal and an older one just after the seal let it go. A second pass then sees
                # the new seal; two passes finding nothing is a state that lasted.
                if not _verified(self.directory) and not _verified(self.directory):
                    self.violations.append([s for s, _ in cm.step_dirs(self.directory)])
                self.checks += 1


@pytest.mark.parametrize("async_save", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("keep", [1, 2, 3])
def test_some_step_verifies_at_every_instant_after_the_first_seal(
    tmp_path, monkeypatch, keep, async_save
):
    held = _HeldSeals(monkeypatch)
    checkpoints = workdir.Checkpoints(tmp_path, keep=keep, async_save=async_save,
                                      log=pytest.fail)  # fmt: skip
    checkpoints.open_for_writing()
    directory = checkpoints.directory
    watcher = _Watcher(directory)
    watcher.start()
    saves = [2, 4, 6, 8, 10]
    try:
        for i, step in enumerate(saves):
            saver = threading.Thread(target=checkpoints.save,
                                     args=(step, _state(step), RNG, {"step": step}))  # fmt: skip
            saver.start()
            assert held.wait() == step
            # The window: orbax has committed the step, bertjax has not sealed it. A kill now
            # leaves the steps sealed before it, the newest `keep` of them.
            assert ocp.step.is_checkpoint_finalized(directory / str(step))
            assert not (directory / str(step) / cm.MANIFEST_FILE).exists()
            assert _verified(directory) == saves[max(0, i - keep) : i][::-1]
            held.release.set()
            saver.join()
            checkpoints.sealer.wait_sealed()  # sealed, and what keep allows deleted
            watcher.armed.set()
            assert _verified(directory) == saves[max(0, i + 1 - keep) : i + 1][::-1]
        checkpoints.finish()
    finally:
        held.release.set()
        watcher.done.set()
        watcher.join()
        checkpoints.close()
    assert watcher.checks > 0 and watcher.violations == []
    assert [step for step, _ in cm.step_dirs(directory)] == saves[-keep:][::-1]


def test_a_run_counts_the_steps_it_found_and_deletes_them_only_after_its_own_seal(tmp_path):
    checkpoints = workdir.Checkpoints(tmp_path, keep=2, async_save=True, log=pytest.fail)
    checkpoints.open_for_writing()
    for step in (1, 2, 3):
        checkpoints.save(step, _state(step), RNG, {"step": step})
    checkpoints.finish()
    checkpoints.close()
    directory = checkpoints.directory
    assert [s for s, _ in cm.step_dirs(directory)] == [3, 2]
    (directory / "2" / cm.MANIFEST_FILE).unlink()  # a deletion killed half way: older, unsealed

    lines = []
    checkpoints = workdir.Checkpoints(tmp_path, keep=2, async_save=True, log=lines.append)
    checkpoints.open_for_writing()
    assert [s for s, _ in cm.step_dirs(directory)] == [3, 2]  # nothing deleted on opening
    checkpoints.save(4, _state(4), RNG, {"step": 4})
    checkpoints.finish()
    checkpoints.close()
    assert [s for s, _ in cm.step_dirs(directory)] == [4, 3] and _verified(directory) == [4, 3]
    assert lines == []


def test_a_failed_deletion_is_one_line_and_tried_again_after_the_next_seal(tmp_path, monkeypatch):
    for step in (1, 2):
        (tmp_path / str(step)).mkdir()
        (tmp_path / str(step) / "data").write_bytes(bytes([step]) * 10)
        cm.write_manifest(tmp_path / str(step))
    lines, real = [], retention.delete_step

    def flaky(step_dir):
        if epath_name(step_dir) == "1" and not lines:
            raise OSError("503 Service Unavailable")
        real(step_dir)

    monkeypatch.setattr(retention, "delete_step", flaky)
    kept = retention.Retention(tmp_path, 1, [1], log=lines.append)
    assert kept.sealed(2) == []
    assert lines == ["checkpoint step 1: could not delete it (OSError: 503 Service Unavailable)"]
    assert [s for s, _ in cm.step_dirs(tmp_path)] == [2, 1]
    (tmp_path / "3").mkdir()
    (tmp_path / "3" / "data").write_bytes(b"3")
    cm.write_manifest(tmp_path / "3")
    assert kept.sealed(3) == [1, 2] and [s for s, _ in cm.step_dirs(tmp_path)] == [3]


@pytest.mark.parametrize("keep", [0, -1, 1.5, True, "2"])
def test_keep_below_one_or_not_an_integer_is_one_line(tmp_path, keep):
    expected = r"^config\.checkpoint\.keep=.*: expected an integer >= 1$"
    with pytest.raises(ValueError, match=expected):
        workdir.Checkpoints(tmp_path, keep=keep, async_save=True)


def test_keep_every_keeps_its_multiples_for_good_beside_the_newest_keep(tmp_path):
    """A preemption save is a sealed step that counts in ``keep``: without ``keep_every`` it
    pushes out the step a curve needs (issue #38: LTR's steps 500 and 1,000)."""
    checkpoints = workdir.Checkpoints(tmp_path, keep=1, async_save=False, keep_every=4,
                                      log=pytest.fail)  # fmt: skip
    checkpoints.open_for_writing()
    for step in (2, 4, 5, 6):  # 5: a preemption save between two regular ones
        checkpoints.save(step, _state(step), RNG, {"step": step})
    checkpoints.finish()
    checkpoints.close()
    directory = checkpoints.directory
    assert _verified(directory) == [6, 4]
    # A resumed run keeps what it found on disk that is a multiple, and its own.
    checkpoints = workdir.Checkpoints(tmp_path, keep=1, async_save=False, keep_every=4,
                                      log=pytest.fail)  # fmt: skip
    checkpoints.open_for_writing()
    for step in (7, 8, 10):
        checkpoints.save(step, _state(step), RNG, {"step": step})
    checkpoints.finish()
    checkpoints.close()
    assert _verified(directory) == [10, 8, 4]
    assert retention.to_delete([3, 4, 8, 9, 12, 13], keep=2) == [3, 4, 8, 9]
    assert retention.to_delete([3, 4, 8, 9, 12, 13], keep=2, keep_every=4) == [3, 9]


@pytest.mark.parametrize("keep_every", [-1, 1.5, True, "2"])
def test_keep_every_below_zero_or_not_an_integer_is_one_line(tmp_path, keep_every):
    expected = r"^config\.checkpoint\.keep_every=.*: expected an integer >= 0 \(0: off\)$"
    with pytest.raises(ValueError, match=expected):
        workdir.Checkpoints(tmp_path, keep=1, async_save=True, keep_every=keep_every)
