"""When a training run stops: SIGTERM (Cloud TPU maintenance, spot preemption) or SIGINT (Ctrl-C).

The loop (``bertjax.training.loop``) asks :meth:`Preemption.reached` once before every step; when
it is true, the loop saves the current step and returns (exit 0). A second signal raises
KeyboardInterrupt at once (nothing saved).

With several processes every one of them must stop at the same step, or the save (a collective)
would hang. They agree through JAX's distributed runtime, not through the devices: no collective,
no host-device transfer and no message per step, so the host keeps dispatching ahead of the
device (``bench/dispatch_bench.py``). How, in JAX 0.10 (``jax._src.distributed`` and XLA's
``tsl/distributed_runtime/preemption``): ``jax.distributed.initialize`` starts a preemption sync
manager whose notifier installs a C handler for SIGTERM (polled once a second by a thread) and
posts a notice to the coordination service; every process's manager then, in a background
thread, publishes the id of its latest ``reached_preemption_sync_point`` call, waits at a
barrier for all, and sets the sync point to the largest id + 1, holding a lock that the call
waits on meanwhile, so no process can pass the point before it is set.
"""

from __future__ import annotations

import itertools
import os
import signal

import jax
from jax.experimental import multihost_utils


class Preemption:
    """When to stop: SIGTERM (Cloud TPU maintenance, spot preemption) or SIGINT (Ctrl-C).

    One process: its own handlers; :meth:`reached` is true from the first signal on, and a
    second signal raises KeyboardInterrupt at once.

    Several processes: JAX's distributed runtime owns SIGTERM (``jax.distributed.initialize``
    installs its preemption notifier); a SIGINT is handed to it as a SIGTERM to this process,
    and a second SIGINT raises KeyboardInterrupt. On the first notice anywhere, the runtime's
    coordination service collects every process's latest call of
    ``multihost_utils.reached_preemption_sync_point`` in a background thread and picks the next
    call id after the largest as the sync point; the loop calls it once per step (a local check
    of one integer, no device collective, no message), and every process stops at that same
    step. Calls are numbered per process from its first :class:`Preemption` on, so a notice that
    came before the first step stops the run at its first step.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)
    _calls = itertools.count()  # the runtime's call counter is per process, like this one

    def __init__(self):
        self.requested = ""  # the signal's name (this process's own handlers only)
        self.stopped = False
        self.processes = jax.process_count()
        if self.processes > 1:
            self._sync_point()  # call 0: checks that the runtime's preemption service is on
        signals = self.SIGNALS if self.processes == 1 else (signal.SIGINT,)
        self._previous = {s: signal.signal(s, self._handle) for s in signals}

    def _handle(self, signum, frame):
        del frame
        if self.requested:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopped without saving")
        self.requested = signal.Signals(signum).name
        if self.processes > 1:
            os.kill(os.getpid(), signal.SIGTERM)  # to the runtime's notifier

    def _sync_point(self) -> bool:
        try:
            return multihost_utils.reached_preemption_sync_point(next(self._calls))
        except RuntimeError as e:
            raise ValueError(
                f"{self.processes} processes stop together through JAX's preemption service, "
                f"which is off ({e}); set jax_enable_preemption_service"
            ) from None

    def reached(self) -> bool:
        """Whether to save and stop before the next step (called once per step)."""
        self.stopped = self.stopped or (
            self._sync_point() if self.processes > 1 else bool(self.requested)
        )
        return self.stopped

    def reason(self) -> str:
        if self.processes == 1:
            return self.requested
        return "preemption notice (SIGTERM or SIGINT to a process), all processes"

    def restore(self):
        for s, previous in self._previous.items():
            signal.signal(s, previous)
