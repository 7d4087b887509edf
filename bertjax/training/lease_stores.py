"""Compare-and-swap stores for the lease record of :mod:`bertjax.training.lease`.

A store keeps one small object and changes it only by compare-and-swap against the version last
read, so that of two writers racing from the same version exactly one wins:

* :class:`LocalStore` (local paths): every change holds an exclusive ``fcntl.flock`` on the
  sidecar ``WORKDIR/.bertjax_lease.lock`` (never removed: removing a lock file races with its next
  user), compares the current bytes with the expected ones, and publishes new bytes with
  ``bertjax.atomic`` (a temporary file, fsync-ed and ``os.replace``-d), so readers (who take no
  lock) never see a partial record; an ``O_EXCL`` create would show an empty file until its
  write. The version is the bytes themselves (they hold the owner token and a renewal time).
  Needs a filesystem whose ``flock`` excludes across processes: any local disk; NFS emulates it
  with byte-range locks.
* :class:`GcsStore` (``gs://``): GCS object-generation preconditions on one object, whose reads
  are strongly consistent after writes: create with ``if_generation_match=0`` (only if no live
  object), replace and delete with ``if_generation_match=<generation read>``; GCS answers 412
  Precondition Failed when the generation differs (or, for a create, when the object exists).
  Each write gets a new, unique generation. Needs google-cloud-storage
  (``pip install 'bertjax[gcs]'``), imported only for ``gs://`` workdirs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import pathlib
from typing import Protocol

from bertjax import atomic

LEASE_FILE = "bertjax_lease.json"
LOCK_FILE = ".bertjax_lease.lock"


class StoreConflict(Exception):
    """A store's compare-and-swap found a different version (or none) than expected."""


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The bytes of the lease record and the store's version of them."""

    data: bytes
    version: object


class LeaseStore(Protocol):
    """Compare-and-swap storage of one small object (the lease record)."""

    where: str

    def read(self) -> Snapshot | None:
        """The current record, or None if there is none."""

    def create(self, data: bytes) -> object:
        """Writes ``data`` if no record exists -> its version; StoreConflict otherwise."""

    def replace(self, data: bytes, expected: object) -> object:
        """Writes ``data`` if the record's version is ``expected`` -> new version; else conflict."""

    def delete(self, expected: object) -> None:
        """Removes the record if its version is ``expected``; gone already is fine."""


def open_store(workdir) -> LeaseStore:
    """The store for ``workdir``: :class:`GcsStore` for ``gs://``, :class:`LocalStore` else."""
    text = os.fspath(workdir)
    if text.startswith("gs://"):
        bucket, _, prefix = text[len("gs://") :].partition("/")
        try:
            from google.cloud import storage  # noqa: PLC0415 - optional extra 'gcs'
        except ImportError:
            raise ValueError(
                f"{text}: a gs:// workdir needs google-cloud-storage: pip install 'bertjax[gcs]'"
            ) from None
        name = f"{prefix.rstrip('/')}/{LEASE_FILE}" if prefix.strip("/") else LEASE_FILE
        return GcsStore(storage.Client().bucket(bucket), name)
    if "://" in text:
        raise ValueError(f"{text}: a workdir lease needs a local path or gs://")
    return LocalStore(pathlib.Path(text))


class LocalStore:
    """The record as ``WORKDIR/bertjax_lease.json``; each change under a flock on a sidecar."""

    def __init__(self, workdir: pathlib.Path):
        self.path = workdir / LEASE_FILE
        self.where = str(self.path)
        self._lock_path = workdir / LOCK_FILE

    def read(self) -> Snapshot | None:
        try:
            data = self.path.read_bytes()  # whole: every write is a rename
        except FileNotFoundError:
            return None
        return Snapshot(data, data)  # the bytes are the version (they hold token and time)

    def create(self, data: bytes) -> object:
        with self._locked():
            if self.path.exists():
                raise StoreConflict(self.where)
            self._publish(data)
        return data

    def replace(self, data: bytes, expected: object) -> object:
        with self._locked():
            current = self.read()
            if current is None or current.version != expected:
                raise StoreConflict(self.where)
            self._publish(data)
        return data

    def delete(self, expected: object) -> None:
        with self._locked():
            current = self.read()
            if current is not None and current.version != expected:
                raise StoreConflict(self.where)
            self.path.unlink(missing_ok=True)

    @contextlib.contextmanager
    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the flock

    def _publish(self, data: bytes) -> None:
        atomic.write_bytes(self.path, data)  # fsync-ed, then renamed over the record


def gcs_errors() -> tuple[type[Exception], type[Exception]]:
    """(PreconditionFailed, NotFound): google-api-core's classes, or stand-ins without it."""
    try:
        from google.api_core import exceptions  # noqa: PLC0415 - optional extra 'gcs'
    except ImportError:
        return _PreconditionFailed, _NotFound
    return exceptions.PreconditionFailed, exceptions.NotFound


def _api_error() -> type[Exception]:
    """google-api-core's base of HTTP errors (a stand-in, never raised, without it)."""
    try:
        from google.api_core import exceptions  # noqa: PLC0415 - optional extra 'gcs'
    except ImportError:
        return _ApiError
    return exceptions.GoogleAPICallError


class _ApiError(Exception):
    """Stand-in for google-api-core's GoogleAPICallError where it is not installed."""


class _PreconditionFailed(Exception):
    """HTTP 412 stand-in where google-api-core is not installed (in-memory test buckets)."""


class _NotFound(Exception):
    """HTTP 404 stand-in where google-api-core is not installed."""


class GcsStore:
    """The record as one GCS object, changed only under object-generation preconditions.

    ``bucket`` is a ``google.cloud.storage.Bucket`` (or anything with its ``get_blob`` /
    ``blob`` and the blobs' ``download_as_bytes`` / ``upload_from_string`` / ``delete``).
    Any other HTTP error (a forbidden or missing bucket; the client has retried the transient
    ones) is an OSError naming the object, one line.
    """

    def __init__(self, bucket, name: str):
        self._bucket = bucket
        self._name = name
        self.where = f"gs://{getattr(bucket, 'name', '?')}/{name}"
        self._precondition_failed, self._not_found = gcs_errors()
        self._api_error = _api_error()

    def read(self) -> Snapshot | None:
        with self._named_errors():
            return self._read()

    def create(self, data: bytes) -> object:
        with self._named_errors():
            return self._upload(data, 0)

    def replace(self, data: bytes, expected: object) -> object:
        with self._named_errors():
            return self._upload(data, expected)

    def delete(self, expected: object) -> None:
        with self._named_errors():
            self._delete(expected)

    @contextlib.contextmanager
    def _named_errors(self):
        try:
            yield
        except self._api_error as e:  # the expected 404s and 412s were handled inside
            raise OSError(f"{self.where}: {' '.join(str(e).split())}") from None

    def _read(self) -> Snapshot | None:
        for _ in range(8):
            blob = self._bucket.get_blob(self._name)
            if blob is None:
                return None
            try:  # the data must be that generation's: it may change between the two requests
                data = blob.download_as_bytes(if_generation_match=blob.generation)
            except (self._precondition_failed, self._not_found):
                continue
            return Snapshot(data, blob.generation)
        raise StoreConflict(f"{self.where}: changed under 8 reads in a row")

    def _delete(self, expected: object) -> None:
        try:
            self._bucket.blob(self._name).delete(if_generation_match=expected)
        except self._not_found:
            pass
        except self._precondition_failed:
            raise StoreConflict(self.where) from None

    def _upload(self, data: bytes, generation) -> object:
        blob = self._bucket.blob(self._name)
        try:
            blob.upload_from_string(
                data, content_type="application/json", if_generation_match=generation
            )
        except self._precondition_failed:
            raise StoreConflict(self.where) from None
        return blob.generation
