"""Checkpoints verified before they are trusted: a manifest of every file, written last.

After orbax has finalized a step, ``STEP_DIR/bertjax_manifest.json`` records every file under
it::

    {"format_version": 1, "checksum": "crc32c",
     "files": [{"path": "state/_METADATA", "size": 476, "checksum": "8f3c1b2a"}, ...]}

``checksum`` names the algorithm: ``crc32c`` (the checksum GCS keeps for every object; on local
disks computed with google-crc32c, when installed: over a 1 GiB file read in 4 MiB chunks on a
2-core Xeon 4.6-5.1 GB/s against zlib.crc32's 2.5-2.9 GB/s from the page cache; both near the
disk's speed cold; see docs/benchmarks.md) or ``crc32`` (zlib, always there). Values are 8
lowercase hex digits. The manifest is written atomically (``bertjax.atomic``: temporary name +
rename locally; one object write on GCS) and last, so it is bertjax's own commit marker: a step
without one is an
incomplete save, whatever orbax left.

**What verifies.** Every listed file exists with the listed size and checksum, and no other file
is present: an unlisted file is not inert, since orbax finds some files by listing directories
(``ocdbt.process_*``), so restore could read it. Empty directories (and GCS's directory marker
objects, ``name/``) are ignored. :func:`verify` checks what costs no reads first (missing, size,
unexpected files, in path order), then checksums, and names the first bad file.

**Where the checksums come from.** On a local disk (or ``gs://`` without google-cloud-storage)
files are read in 4 MiB chunks by a few threads (bounded memory), through ``etils.epath``: one
read of the step per seal and per verification. On ``gs://`` with google-cloud-storage (the
``gcs`` extra, which a ``gs://`` workdir needs for its lease anyway) nothing is read: one object
listing of the step's prefix gives each object's size and the crc32c that GCS computed when the
object was written and keeps with it; sealing records those, verification compares them (a
manifest of zlib crc32 values, sealed elsewhere, is verified by reading). That catches an
object that is missing, truncated, replaced or added after the seal; corruption at rest inside
GCS is GCS's own to detect (it checks its stored checksums).

**Hooking into orbax (0.12.8).** ``AsyncOptions(post_finalization_callback=...)`` runs in
orbax's background thread *before* orbax commits the step: the directory still has its
``.orbax-checkpoint-tmp`` name, ``commit_success.txt`` is not written and ``_CHECKPOINT_METADATA``
is rewritten afterwards with the commit time; the callback is also not told the step. A manifest
written there would not match what orbax leaves. :class:`ManifestSealer` instead takes each step
after ``manager.save`` returns and, in its own thread, waits until orbax's public
``ocp.step.is_checkpoint_finalized`` holds for the step directory (renamed locally;
``commit_success.txt`` present on GCS), then writes the manifest; training never waits for it.
A step whose save is killed before its manifest is written is skipped at restore (one interval
lost), never trusted.

**Restore (for the training loop).** Process 0 calls :func:`latest_verified_step` and shares the
step with the other processes; the loop restores that step explicitly (``manager.restore(step)``,
not ``latest_step()``, which would take a newer unverified step). ``None`` with
:func:`step_dirs` non-empty means no checkpoint verifies: the loop says so and starts nothing
(it must not silently start from scratch over a corrupt run). Steps newer than the restored one
are moved to ``checkpoints_rejected/`` (local disks) or deleted, manifest first (``gs://``), once
the run is accepted and before it saves those steps again (orbax refuses to save a step that
exists; ``bertjax.training.workdir``). Only process 0 writes manifests.

**Deleting.** Nothing here deletes a sealed step: orbax's ``max_to_keep`` is off and
``bertjax.training.retention`` deletes steps beyond ``keep`` from the sealer's thread, only
after a newer step is sealed (``ManifestSealer(on_sealed=)``).
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import functools
import json
import posixpath
import queue
import re
import threading
import zlib
from collections.abc import Callable

import orbax.checkpoint as ocp
from etils import epath

from bertjax import atomic

MANIFEST_FILE = "bertjax_manifest.json"
FORMAT_VERSION = 1
CHUNK_BYTES = 4 << 20
READ_THREADS = 4
_TMP_PREFIX = f".{MANIFEST_FILE}.tmp-"
_STEP_NAME = re.compile(r"[0-9]+")
_HEX8 = re.compile(r"[0-9a-f]{8}")


class CheckpointCorrupt(ValueError):
    """A step directory does not match its manifest, or has none (``incomplete``)."""

    def __init__(self, step_dir, reason: str, *, incomplete: bool = False):
        super().__init__(f"{step_dir}: {reason}")
        self.step_dir, self.reason, self.incomplete = str(step_dir), reason, incomplete


# ---------------------------------------------------------------- checksums


def default_algorithm() -> str:
    """``crc32c`` where google-crc32c is installed, else ``crc32`` (zlib)."""
    try:
        import google_crc32c  # noqa: F401, PLC0415 - optional: faster, and GCS's own checksum
    except ImportError:
        return "crc32"
    return "crc32c"


def _extender(algorithm: str, manifest_path) -> Callable[[int, bytes], int]:
    if algorithm == "crc32":
        return lambda value, chunk: zlib.crc32(chunk, value)
    try:
        import google_crc32c  # noqa: PLC0415
    except ImportError:
        raise ValueError(
            f"{manifest_path}: checksums are crc32c; verifying them needs pip install google-crc32c"
        ) from None
    return google_crc32c.extend


def _checksum(path: epath.Path, extend) -> tuple[int, str] | None:
    """(bytes read, checksum as 8 hex digits) of one file read in CHUNK_BYTES pieces; None if
    it does not exist (any more)."""
    size, value = 0, 0
    try:
        with path.open("rb") as f:
            while chunk := f.read(CHUNK_BYTES):
                size += len(chunk)
                value = extend(value, chunk)
    except FileNotFoundError:
        return None
    return size, f"{value:08x}"


def _checksums(step_dir: epath.Path, paths: list[str], extend):
    """Yields (path, _checksum(...)) in order; READ_THREADS threads read ahead. Close it (or
    exhaust it) to stop the reads."""
    with concurrent.futures.ThreadPoolExecutor(READ_THREADS) as pool:
        futures = [pool.submit(_checksum, step_dir / p, extend) for p in paths]
        try:
            for path, future in zip(paths, futures, strict=True):
                yield path, future.result()
        finally:
            for future in futures:
                future.cancel()


# ---------------------------------------------------------------- listing and the manifest


def _list_files(step_dir: epath.Path) -> dict[str, int]:
    """Relative POSIX path -> size of every file under ``step_dir`` (manifest files excluded)."""
    files = {}
    for directory, _, names in step_dir.walk():
        for name in names:
            path = epath.Path(directory) / name
            relative = path.relative_to(step_dir).as_posix()
            if relative == MANIFEST_FILE or relative.startswith(_TMP_PREFIX):
                continue
            files[relative] = path.stat().length
    return files


@functools.cache
def _storage_client():
    """A google-cloud-storage client (its credentials are looked up once), or None without it."""
    try:
        from google.cloud import storage  # noqa: PLC0415 - optional extra 'gcs'
    except ImportError:
        return None
    return storage.Client()


def _gcs_listing(step_dir: epath.Path) -> dict[str, tuple[int, str]] | None:
    """On ``gs://``: relative path -> (size, crc32c as 8 hex digits) of every object under
    ``step_dir``, from one listing (a page per 1,000 objects; nothing is read). None for local
    paths, and where google-cloud-storage is not installed (the caller reads the files)."""
    text = str(step_dir)
    if not text.startswith("gs://") or (client := _storage_client()) is None:
        return None
    bucket, _, prefix = text[len("gs://") :].partition("/")
    prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
    found = {}
    blobs = client.list_blobs(bucket, prefix=prefix, fields="items(name,size,crc32c),nextPageToken")
    for blob in blobs:
        relative = blob.name[len(prefix) :]
        if not relative or relative.endswith("/"):  # directory marker objects
            continue
        if relative == MANIFEST_FILE or relative.startswith(_TMP_PREFIX):
            continue
        found[relative] = (int(blob.size), base64.b64decode(blob.crc32c).hex())  # big-endian
    return found


def _valid_path(path) -> bool:
    return (
        isinstance(path, str)
        and path not in ("", MANIFEST_FILE)
        and not path.startswith("/")
        and "\\" not in path
        and "\0" not in path
        and posixpath.normpath(path) == path
        and ".." not in path.split("/")
    )


def _read_manifest(step_dir: epath.Path) -> tuple[str, list[tuple[str, int, str]]]:
    """(algorithm, [(path, size, checksum)] sorted by path); CheckpointCorrupt if absent/bad."""
    try:
        data = (step_dir / MANIFEST_FILE).read_bytes()
    except FileNotFoundError:
        empty = not step_dir.exists() or not any(step_dir.iterdir())
        what = "empty directory" if empty else "no manifest"
        raise CheckpointCorrupt(step_dir, f"{what} (incomplete save)", incomplete=True) from None
    try:
        raw = json.loads(data)
        if raw["format_version"] != FORMAT_VERSION or raw["checksum"] not in ("crc32c", "crc32"):
            raise ValueError(f"format_version {FORMAT_VERSION} and checksum crc32c or crc32")
        entries = [(e["path"], e["size"], e["checksum"]) for e in raw["files"]]
        for path, size, checksum in entries:
            if not _valid_path(path) or type(size) is not int or size < 0:
                raise ValueError(f"a relative path and a size >= 0, got {_short(path)} {size!r}")
            if not isinstance(checksum, str) or not _HEX8.fullmatch(checksum):
                raise ValueError(f"8 lowercase hex digits, got {_short(checksum)}")
        if len({path for path, _, _ in entries}) != len(entries):
            raise ValueError("each path once")
    except (ValueError, TypeError, KeyError, RecursionError) as e:  # JSON errors: ValueError
        what = f"expected {e}" if type(e) is ValueError else f"{type(e).__name__}: {_short(e)}"
        raise CheckpointCorrupt(step_dir, f"{MANIFEST_FILE}: malformed ({what})") from None
    return raw["checksum"], sorted(entries)


def _short(value) -> str:
    text = repr(value) if not isinstance(value, BaseException) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def write_manifest(step_dir, *, overwrite: bool = False) -> epath.Path:
    """Records every file of a finalized step -> the manifest's path. Local or ``gs://``.

    Call only once orbax has finalized the step (see :class:`ManifestSealer`). Refuses orbax
    temporary directories, and an existing manifest unless ``overwrite``.
    """
    step_dir = epath.Path(step_dir)
    target = step_dir / MANIFEST_FILE
    if ocp.step.TMP_DIR_SUFFIX in step_dir.name:
        raise ValueError(f"{step_dir}: an orbax temporary directory; wait until it is finalized")
    if target.exists() and not overwrite:
        raise ValueError(f"{target}: exists already (overwrite=True replaces it)")
    listing = _gcs_listing(step_dir)
    listed = _list_files(step_dir) if listing is None else listing
    if not listed:
        raise ValueError(f"{step_dir}: no files to record")
    if listing is not None:  # GCS's own checksums: nothing is read
        algorithm = "crc32c"
        files = [
            {"path": p, "size": size, "checksum": crc} for p, (size, crc) in sorted(listing.items())
        ]
    else:
        algorithm, files = default_algorithm(), []
        for path, result in _checksums(step_dir, sorted(listed), _extender(algorithm, "")):
            if result is None:
                raise FileNotFoundError(f"{step_dir / path}: removed while being recorded")
            if result[0] != listed[path]:
                raise ValueError(f"{step_dir / path}: changed while the manifest was being written")
            files.append({"path": path, "size": result[0], "checksum": result[1]})
    head = json.dumps({"format_version": FORMAT_VERSION, "checksum": algorithm})[:-1]
    text = head + ', "files": [\n' + ",\n".join(map(json.dumps, files)) + "\n]}\n"
    atomic.write_text(target, text)  # its temporary is named _TMP_PREFIX..., never listed
    return target


# ---------------------------------------------------------------- verification


def verify(step_dir) -> None:
    """Raises CheckpointCorrupt (one line: the step and the first bad file) unless ``step_dir``
    matches its manifest exactly; ``incomplete`` is set when there is no manifest."""
    step_dir = epath.Path(step_dir)
    algorithm, entries = _read_manifest(step_dir)
    listing = _gcs_listing(step_dir)
    present = _list_files(step_dir) if listing is None else {p: s for p, (s, _) in listing.items()}
    for path, size, _ in entries:
        if path not in present:
            raise CheckpointCorrupt(step_dir, f"{path}: missing")
        if present[path] != size:
            raise CheckpointCorrupt(
                step_dir, f"{path}: size differs: expected {size} got {present[path]}"
            )
    unexpected = sorted(set(present) - {path for path, _, _ in entries})
    if unexpected:
        raise CheckpointCorrupt(step_dir, f"{unexpected[0]}: unexpected file (not in the manifest)")
    if listing is not None and algorithm == "crc32c":
        for path, _, expected in entries:
            if listing[path][1] != expected:
                raise CheckpointCorrupt(
                    step_dir,
                    f"{path}: checksum differs: expected crc32c {expected} got {listing[path][1]}",
                )
        return
    extend = _extender(algorithm, step_dir / MANIFEST_FILE)
    paths = [path for path, _, _ in entries]
    with contextlib.closing(_checksums(step_dir, paths, extend)) as results:
        for (path, _, expected), (_, result) in zip(entries, results, strict=True):
            if result is None:
                raise CheckpointCorrupt(step_dir, f"{path}: missing")
            if result[1] != expected:
                raise CheckpointCorrupt(
                    step_dir,
                    f"{path}: checksum differs: expected {algorithm} {expected} got {result[1]}",
                )


def step_dirs(checkpoints_dir) -> list[tuple[int, epath.Path]]:
    """(step, directory) of every numerically named directory, newest first (orbax temporary
    directories, ``<step>.orbax-checkpoint-tmp...``, are not steps)."""
    root = epath.Path(checkpoints_dir)
    if not root.exists():
        return []
    found = [(int(p.name), p) for p in root.iterdir() if _STEP_NAME.fullmatch(p.name)]
    return sorted(((step, p) for step, p in found if p.is_dir()), key=lambda sp: -sp[0])


def latest_verified_step(checkpoints_dir, *, log: Callable[[str], None] = print) -> int | None:
    """The newest step that verifies, or None; one ``log`` line per step passed over.

    ``None`` while :func:`step_dirs` is non-empty means no checkpoint verifies: the caller says
    so and starts nothing.
    """
    candidates = step_dirs(checkpoints_dir)
    for i, (step, path) in enumerate(candidates):
        try:
            verify(path)
            return step
        except CheckpointCorrupt as e:
            then = f"trying step {candidates[i + 1][0]}" if i + 1 < len(candidates) else "none left"
            if e.incomplete:
                log(f"checkpoint step {step}: {e.reason}; {then}")
            else:
                log(f"checkpoint step {step} failed verification: {e.reason}; {then}")
    return None


# ---------------------------------------------------------------- the hook into orbax saves


class ManifestSealer:
    """Writes each saved step's manifest once orbax has finalized it, in a background thread.

    ::

        sealer = ManifestSealer(manager.directory, on_sealed=retention.sealed)  # process 0 only
        if manager.save(step, args=...):
            sealer.submit(step)
        ...
        manager.wait_until_finished()
        sealer.close()                                   # raises what sealing raised

    Step directories are named ``str(step)`` (orbax's default, as ``bertjax.checkpoint.
    create_manager`` makes them). ``close`` waits for the submitted steps; one that orbax has not
    finalized by then (its save failed) is left without a manifest, with a notice to ``log``.
    Waiting polls ``is_checkpoint_finalized`` (a stat locally; one or two GCS requests), first
    after ``first_poll_s`` seconds, then at twice the interval each time up to ``poll_s``: a small
    save is sealed within tens of milliseconds, a large one costs a request a second.
    ``on_sealed(step)`` runs in the sealer's thread right after a step's manifest is written:
    the one place a step may be deleted (``bertjax.training.retention``; orbax's ``max_to_keep``
    must be off, or it deletes older steps before the newer one is sealed).
    """

    def __init__(
        self,
        checkpoints_dir,
        *,
        log: Callable[[str], None] = print,
        poll_s=1.0,
        first_poll_s=0.05,
        on_sealed: Callable[[int], object] = lambda step: None,
    ):
        self._root = epath.Path(checkpoints_dir)
        self._log, self._on_sealed = log, on_sealed
        self._poll_s, self._first_poll_s = poll_s, min(first_poll_s, poll_s)
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._closing = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="manifest-sealer", daemon=True)
        self._thread.start()

    def submit(self, step: int) -> None:
        """Queues ``step`` (whose save was just started) to be sealed when orbax finalizes it."""
        self._raise_error()
        self._queue.put(int(step))

    def wait_sealed(self) -> None:
        """Waits until every submitted step is sealed (or given up), then raises a sealing error.
        Called before each new save, so that at most one step is ever saved but unsealed and a
        failed seal stops the run at its next save."""
        self._queue.join()
        self._raise_error()

    def close(self) -> None:
        """Waits for the queued steps (call after ``manager.wait_until_finished()``)."""
        self._closing.set()
        self._queue.put(None)
        self._thread.join()
        self._raise_error()

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self) -> None:
        while True:
            step = self._queue.get()
            try:
                if step is None:
                    return
                self._seal(step)
            except BaseException as e:  # surfaced by the next submit(), wait_sealed() or close()
                self._error = self._error or e
            finally:
                self._queue.task_done()

    def _seal(self, step: int) -> None:
        step_dir = self._root / str(step)
        wait = self._first_poll_s
        while True:
            # Read before looking: only a look that began after close() was called (so after
            # orbax finished) may give up. One that began earlier can answer "not yet" for a
            # step orbax finalized meanwhile (a slow listing), and is followed by another.
            closing = self._closing.is_set()
            if ocp.step.is_checkpoint_finalized(step_dir):
                break
            if closing:  # orbax is done: this save never finalized
                self._log(f"checkpoint step {step}: not finalized by orbax; left unsealed")
                return
            self._closing.wait(wait)  # close() wakes it
            wait = min(2 * wait, self._poll_s)
        try:
            write_manifest(step_dir)
        except FileNotFoundError:  # removed by something else while being read
            self._log(f"checkpoint step {step}: removed before its manifest was written")
            return
        self._on_sealed(step)
