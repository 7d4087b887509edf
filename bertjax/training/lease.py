"""One writer per workdir: a lease object that its holder renews.

A run takes the lease before it writes anything into ``WORKDIR`` and keeps it until it stops::

    with lease.acquire(workdir) as held:      # LeaseError if another run holds it
        ...
        held.check()                          # before each save: LeaseError if it was lost

``WORKDIR/bertjax_lease.json`` holds ``{host, pid, machine, token, started, renewed,
ttl_seconds, renew_every}``. ``token`` is random per acquisition and names the owner; times are
Unix seconds from the holder's clock. A daemon thread rewrites the record every ``renew_every``
seconds, each time as a compare-and-swap against the version it wrote last.

**Who may take it.** A holder is *live* unless (a) the reader's clock is more than the holder's
``ttl_seconds`` past ``renewed``, or (b) it ran on this machine (same host name, boot id and pid
namespace) and its pid is gone. A live holder makes :func:`acquire` raise :class:`LeaseError`
naming it; a dead one is taken over with a one-line notice. (b) errs on the safe side: a reused
pid or an unreaped zombie reads as alive, so the taker waits for (a).

**What is guaranteed.** Every change of the record is a compare-and-swap, so of any number of
processes that find the same dead lease, exactly one replaces it; the others re-read, find the
winner live and raise. A holder whose renewal finds another token, or no record, or that could not
renew for ``ttl_seconds - renew_every`` seconds (so that others may by now see it as expired)
marks itself lost; :meth:`Lease.check` then raises, and :meth:`Lease.release` leaves the record
alone. The lease is advisory and has no fencing token: a holder that is paused longer than the
ttl between its ``check()`` and its write can still write once after losing the lease. Checking
right before each save keeps that window to one save.

**Clocks.** Expiry compares the holder's ``renewed`` with the reader's clock, so it is correct
while ``ttl_seconds - renew_every`` exceeds the clock skew between the two hosts plus the latency
of one renewal. The defaults (ttl 120 s, renewal every 30 s) leave 90 s, far above the skew of
NTP-synced cloud VMs (well under 1 s); :func:`acquire` refuses ``ttl_seconds < 2 * renew_every``.

**Backends** (:mod:`bertjax.training.lease_stores`): every change of the record is a
compare-and-swap; local paths use an ``fcntl.flock``-guarded rename, ``gs://`` uses
object-generation preconditions. The GCS client retries conditional requests, so a conflict can also
answer the retry of our own successful write: every conflict is re-read, and a record holding our
own bytes counts as written.

**Multi-host.** Only process 0 acquires and renews the lease; the training loop tells the other
processes at its log, eval and save boundaries (``bertjax.training.loop``: one broadcast from
process 0), never per step.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import pathlib
import secrets
import socket
import threading
import time
from collections.abc import Callable

from bertjax.training.lease_stores import LEASE_FILE, LeaseStore, StoreConflict, open_store

__all__ = ["LEASE_FILE", "Lease", "LeaseError", "LeaseRecord", "acquire", "why_not_live"]

FORMAT_VERSION = 1


class LeaseError(ValueError):
    """The workdir is held by another live run, or this run lost its lease."""


# ---------------------------------------------------------------- records


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    """What the holder writes. Times are Unix seconds on the holder's clock."""

    host: str
    pid: int
    machine: str  # boot id / pid namespace, "" where unknown: pids compare only within one
    token: str
    started: float
    renewed: float
    ttl_seconds: float
    renew_every: float

    def to_bytes(self) -> bytes:
        return json.dumps({"format_version": FORMAT_VERSION, **dataclasses.asdict(self)}).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> LeaseRecord:
        """Parses a record; LeaseError naming ``where`` if it is not a bertjax lease."""
        try:
            raw = json.loads(data)
            if raw.pop("format_version") != FORMAT_VERSION:
                raise ValueError("format_version")
            record = cls(**raw)
            types = {"host": str, "pid": int, "machine": str, "token": str}
            times = ("started", "renewed", "ttl_seconds", "renew_every")
            if any(not isinstance(getattr(record, k), t) for k, t in types.items()) or any(
                not isinstance(getattr(record, k), int | float)
                or not math.isfinite(getattr(record, k))
                for k in times
            ):
                raise ValueError("field types")
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise LeaseError(
                f"{where}: not a bertjax lease ({type(e).__name__}: {e}); expected JSON with "
                f"format_version {FORMAT_VERSION}; remove it if no run uses this workdir"
            ) from None
        return record


def _machine_id() -> str:
    """Boot id + pid namespace: two processes compare pids only if these are equal."""
    try:
        boot = pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # exists under another user, or not a pid we can judge: assume alive
    return True


def _utc(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def why_not_live(record: LeaseRecord, now: float) -> str | None:
    """None if ``record``'s holder may be alive at ``now`` (reader's clock); else why not."""
    age = now - record.renewed
    if age > record.ttl_seconds:
        return f"last renewed {_duration(age)} ago"
    here = _machine_id()
    if (
        record.host == socket.gethostname()
        and here
        and record.machine == here
        and not _pid_alive(record.pid)
    ):
        return f"no longer running on this host; last renewed {_duration(age)} ago"
    return None


# ---------------------------------------------------------------- acquire / renew / release


class Lease:
    """A held lease: renewed in a daemon thread until :meth:`release`; a context manager."""

    def __init__(self, workdir: str, store: LeaseStore, record: LeaseRecord, version, notice):
        self.workdir = workdir
        self.store = store
        self.record = record
        self.notice = notice  # the takeover notice, if this acquisition took over a dead lease
        self._version = version
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._lost_reason: str | None = None
        self._released = False
        self._last_renewal = time.monotonic()
        self._last_error: str | None = None
        self._thread = threading.Thread(target=self._renew_loop, name="lease-renewal", daemon=True)
        self._thread.start()

    @property
    def lost(self) -> bool:
        return self._lost_reason is not None

    def check(self) -> None:
        """Raises LeaseError (one line) if the lease was lost; call before each write."""
        if self._lost_reason is not None:
            raise LeaseError(
                f"{self.workdir}: this run lost its lease ({self._lost_reason}); "
                "stopping without writing"
            )

    def renew(self) -> None:
        """Rewrites the record with a new ``renewed`` time, or marks the lease lost."""
        with self._mutex:
            if self.lost or self._released:
                return
            fresh = dataclasses.replace(self.record, renewed=time.time())
            try:
                self._version = _write(self.store, fresh.to_bytes(), self._version)
                self.record, self._last_renewal, self._last_error = fresh, time.monotonic(), None
            except StoreConflict:
                self._lost_reason = self._taken_by()
            except Exception as e:  # I/O or network: retried next period until the deadline
                self._last_error = f"{type(e).__name__}: {e}"
                silent = time.monotonic() - self._last_renewal
                if silent > self.record.ttl_seconds - self.record.renew_every:
                    self._lost_reason = (
                        f"could not renew for {_duration(silent)}: {self._last_error}"
                    )

    def release(self) -> bool:
        """Stops renewing; removes the record if we still own it -> whether it was removed."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        with self._mutex:
            if self.lost or self._released:
                return False
            self._released = True
            try:
                self.store.delete(self._version)
            except StoreConflict:
                return False
            return True

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.record.renew_every) and not self.lost:
            self.renew()

    def _taken_by(self) -> str:
        try:
            snapshot = self.store.read()
            if snapshot is None:
                return "its record was removed"
            other = LeaseRecord.from_bytes(snapshot.data, self.store.where)
        except Exception as e:  # the reason is only for the message: never fail the renewal
            return f"its record was changed by another writer ({type(e).__name__})"
        return f"taken over by host {other.host} pid {other.pid} at {_utc(other.started)}"


def _write(store: LeaseStore, data: bytes, expected) -> object:
    """Create (``expected is None``) or compare-and-swap; a conflict whose current bytes are
    ``data`` was our own write answered twice (a retried request), so it counts as written."""
    try:
        return store.create(data) if expected is None else store.replace(data, expected)
    except StoreConflict:
        current = store.read()
        if current is not None and current.data == data:
            return current.version
        raise


def acquire(
    workdir,
    *,
    ttl_seconds: float = 120.0,
    renew_every: float = 30.0,
    log: Callable[[str], None] | None = print,
    store: LeaseStore | None = None,
) -> Lease:
    """Takes the lease on ``workdir`` (local path or ``gs://``) -> a renewing :class:`Lease`.

    Raises LeaseError (one line naming the holder) if a live run holds it. A dead or expired
    holder is taken over; the one-line notice goes to ``log`` and ``Lease.notice``. ``store``
    replaces the backend chosen from ``workdir`` (tests, or a caller's own GCS client).
    """
    if not 0 < 2 * renew_every <= ttl_seconds:
        raise ValueError(
            f"lease: ttl_seconds={ttl_seconds} must be at least 2 x renew_every={renew_every} > 0"
        )
    store = store or open_store(workdir)
    now = time.time()
    mine = LeaseRecord(
        host=socket.gethostname(),
        pid=os.getpid(),
        machine=_machine_id(),
        token=secrets.token_hex(16),
        started=now,
        renewed=now,
        ttl_seconds=float(ttl_seconds),
        renew_every=float(renew_every),
    )
    for _ in range(8):  # each lost race re-reads; the winner is then live and we raise
        try:
            current = store.read()
        except StoreConflict:
            continue
        notice = None
        if current is not None:
            holder = LeaseRecord.from_bytes(current.data, store.where)
            reason = why_not_live(holder, time.time())
            if reason is None:
                raise _in_use(str(workdir), holder, time.time())
            notice = f"taking over the lease of {workdir} from host {holder.host} pid "
            notice += f"{holder.pid} ({reason})"
        try:
            version = _write(store, mine.to_bytes(), None if current is None else current.version)
        except StoreConflict:
            continue
        if notice and log:
            log(notice)
        return Lease(str(workdir), store, mine, version, notice)
    raise LeaseError(f"{workdir}: the lease changed hands 8 times while taking it; retry")


def _in_use(where: str, holder: LeaseRecord, now: float) -> LeaseError:
    expires = math.ceil(max(0.0, holder.ttl_seconds - (now - holder.renewed)))
    return LeaseError(
        f"{where} is in use by host {holder.host} pid {holder.pid} since {_utc(holder.started)} "
        f"(renewed {_duration(now - holder.renewed)} ago); stop that run or use another workdir "
        f"(a holder that stops renewing is taken over {expires} s after its last renewal)"
    )
