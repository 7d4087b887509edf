"""Checkpoint retention: which steps of a workdir a run deletes, and when. bertjax alone decides.

**The invariant.** After the first step of a workdir is sealed (``checkpoint_manifest``), at
every instant at least one step verifies, for every ``config.checkpoint.keep >= 1``, on local
disks and on ``gs://``, with async and sync saves. Tested by killing runs inside the window
between orbax's commit of a step and its seal (``tests/training/retention_test.py``, and the
commands' kill tests named in ``docs/guarantees.md``).

**Why orbax does not delete.** Orbax's ``max_to_keep`` deletes the oldest step right after the
newest one *commits* (``CheckpointManager._finalize``: wait for the writers, then delete), and
bertjax seals a step only after that (its manifest is bertjax's commit marker). With
``max_to_keep=1`` a kill between the two left no step that verifies. So the manager runs with
``max_to_keep=None`` and the sealer hands every step it sealed to :meth:`Retention.sealed`, on
process 0, in the sealer's thread:

- the steps a run retains are the newest ``keep`` of: the steps in ``checkpoints/`` when the run
  opened it for writing (the restored step and older ones; newer, unverified ones were moved
  aside or deleted by then) and the steps this run has sealed;
- once step S is sealed, every retained-list step older than those ``keep`` is deleted. S is the
  newest of them and ``keep >= 1``, so the newest sealed step is never deleted, and a step is
  deleted only after a newer one was sealed. Steps saved but not sealed yet are never touched;
- **``config.checkpoint.keep_every = N``** (0: off) keeps every step that is a multiple of N for
  good, beside the newest ``keep`` and not counted in them (orbax's ``keep_period``): the steps a
  run is evaluated or sampled at (a curve of fine-tuned snapshots) survive any number of
  preemption saves, each of which is a sealed step that counts in ``keep``.

**How a step is deleted**: its manifest first, then the rest (:func:`delete_step`). A step whose
deletion has begun can never verify again, so a kill half way leaves an incomplete step, older
than a sealed one, which the next run passes over and deletes in turn. Between a seal and the
deletion it allows, ``keep + 1`` steps are on disk (as with orbax, which deleted after a commit).
A deletion that fails is one line, and is tried again after the next seal.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable

from etils import epath

from bertjax.training.checkpoint_manifest import MANIFEST_FILE


def delete_step(step_dir: epath.Path) -> None:
    """Deletes a step directory, manifest first; local or ``gs://``; no error if it is gone."""
    (step_dir / MANIFEST_FILE).unlink(missing_ok=True)
    if str(step_dir).startswith("gs://"):
        step_dir.rmtree(missing_ok=True)
    else:
        shutil.rmtree(step_dir, ignore_errors=True)


def check_keep(keep) -> int:
    """``keep`` as an int; ValueError (one line) unless it is >= 1."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"config.checkpoint.keep={keep!r}: expected an integer >= 1")
    return keep


def check_keep_every(keep_every) -> int:
    """``keep_every`` as an int; ValueError (one line) unless it is >= 0."""
    if isinstance(keep_every, bool) or not isinstance(keep_every, int) or keep_every < 0:
        raise ValueError(
            f"config.checkpoint.keep_every={keep_every!r}: expected an integer >= 0 (0: off)"
        )
    return keep_every


def to_delete(retained: list[int], keep: int, keep_every: int = 0) -> list[int]:
    """The steps of ``retained`` (sealed or present at start, any order) beyond the newest
    ``keep``, oldest first, but for the multiples of ``keep_every`` (> 0), kept for good."""
    every = check_keep_every(keep_every)
    older = sorted(retained)[: -check_keep(keep)]
    return [step for step in older if not (every and step % every == 0)]


class Retention:
    """Deletes what ``keep`` allows once a newer step is sealed (module docstring)::

    retention = Retention(directory, keep, present=[steps on disk], keep_every=0, log=print)
    ... after step S's manifest is written: retention.sealed(S)
    """

    def __init__(self, directory, keep: int, present: list[int], *, keep_every: int = 0,
                 log: Callable[[str], None] = print):  # fmt: skip
        self.directory, self.keep, self.log = epath.Path(directory), check_keep(keep), log
        self.keep_every = check_keep_every(keep_every)
        self.retained = sorted(set(present))

    def sealed(self, step: int) -> list[int]:
        """Records ``step`` as sealed, then deletes the steps beyond the newest ``keep``;
        returns the steps deleted."""
        self.retained = sorted({*self.retained, int(step)})
        deleted = []
        for old in to_delete(self.retained, self.keep, self.keep_every):
            try:
                delete_step(self.directory / str(old))
            except Exception as e:  # noqa: BLE001 - any storage error: tried again after the next seal
                self.log(f"checkpoint step {old}: could not delete it ({type(e).__name__}: {e})")
                continue
            self.retained.remove(old)
            deleted.append(old)
        return deleted
