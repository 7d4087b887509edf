"""Shard pieces: a work unit's part of each output shard, written by the offline builder's workers
and concatenated into the shards (``bertjax.data.offline``, ``offline_beam``), so that no piece
can go missing silently.

**Writing** (:class:`Attempt`, in a worker): one attempt at a unit writes one TFRecord piece per
output shard it has records for, ``<scratch>/unit-UUUUUU-shard-SSSSS-AAAAAAAAAAAA.tfrecord``, where
``AAAAAAAAAAAA`` is the attempt's own random id. Each piece is spooled locally (beside it for a
local scratch, in the worker's temporary directory for ``gs://``) and lands under its name only
when the whole unit has succeeded: one rename, or one complete upload. On a failure the spools are
deleted, so a failed attempt leaves no piece, complete or partial. The attempt returns
:class:`UnitPieces`: its id and, per shard, the records and bytes it wrote.

**Retries**: Beam retries a failed bundle and Dataflow may run a unit twice; each attempt writes
its own names, and only the attempt whose result the runner committed is read (by those names),
so another attempt's pieces are never read. They are removed with the scratch directory.

**Concatenation** knows from the units' results which pieces a shard needs: before anything is
appended, every piece must exist with the size its unit wrote (:func:`check`); while appended,
its bytes and its TFRecord frames must add up to what its unit wrote (:func:`append`). Otherwise a
DataError names the first missing, short or long piece, and the caller's atomic output
(``bertjax.atomic``) leaves no output shard.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import secrets
import shutil
import struct
import sys
import tempfile

from bertjax import atomic
from bertjax.data import sources
from bertjax.data.instances import DataError

_COPY_BYTES = 1 << 22
_STAT_THREADS = 16  # a stat is one request on gs://; a shard checks thousands of pieces


@dataclasses.dataclass(frozen=True)
class Piece:
    """What a piece must be: ``records`` TFRecords in ``size`` bytes of ``unit`` for ``shard``."""

    path: str
    unit: int
    shard: int
    records: int
    size: int


@dataclasses.dataclass(frozen=True)
class UnitPieces:
    """What one committed attempt at ``unit`` wrote: ``shards`` maps a shard to its piece's
    ``(records, bytes)`` (shards without records have no piece)."""

    unit: int
    attempt: str
    shards: dict[int, tuple[int, int]]

    def pieces(self, scratch: str) -> list[Piece]:
        """The pieces, by shard."""
        return [
            Piece(piece_path(scratch, self.unit, shard, self.attempt), self.unit, shard, *counts)
            for shard, counts in sorted(self.shards.items())
        ]


def piece_path(scratch: str, unit: int, shard: int, attempt: str) -> str:
    return f"{scratch}/unit-{unit:06d}-shard-{shard:05d}-{attempt}.tfrecord"


class Attempt:
    """One attempt at ``unit``: ``write(shard, record)``, then ``commit()`` -> UnitPieces. Used as
    a context manager; leaving it uncommitted (an exception) deletes every spool."""

    def __init__(self, scratch: str, unit: int):
        self.scratch, self.unit, self.attempt = scratch, unit, secrets.token_hex(6)
        remote = atomic.is_object_store(scratch)
        self.spool_dir = tempfile.mkdtemp(prefix="bertjax-pieces-", dir=None if remote else scratch)
        self.writers: dict[int, object] = {}
        self.records: dict[int, int] = {}

    def __enter__(self) -> Attempt:
        return self

    def __exit__(self, *exc) -> None:
        for writer in self.writers.values():
            writer.close()  # a local spool: nothing lands anywhere
        shutil.rmtree(self.spool_dir, ignore_errors=True)

    def _spool(self, shard: int) -> str:
        return os.path.join(self.spool_dir, f"shard-{shard:05d}")

    def write(self, shard: int, record: bytes) -> None:
        if shard not in self.writers:
            import tensorflow as tf

            self.writers[shard] = tf.io.TFRecordWriter(self._spool(shard))
            self.records[shard] = 0
        self.writers[shard].write(record)
        self.records[shard] += 1

    def commit(self) -> UnitPieces:
        """Lands every piece under its name (module docstring) -> what was written."""
        for writer in self.writers.values():
            writer.close()
        self.writers = {}
        shards = {}
        for shard, records in sorted(self.records.items()):
            spool = self._spool(shard)
            shards[shard] = (records, os.path.getsize(spool))
            target = piece_path(self.scratch, self.unit, shard, self.attempt)
            if atomic.is_object_store(target):
                import tensorflow as tf

                tf.io.gfile.copy(spool, target, overwrite=True)  # one complete upload
            else:
                os.replace(spool, target)  # the spool is beside it: one rename
        return UnitPieces(self.unit, self.attempt, shards)


def _size(path: str) -> int | None:
    """The file's bytes, None when it does not exist."""
    if sources.is_local(path):
        try:
            return os.path.getsize(path)
        except FileNotFoundError:
            return None
    import tensorflow as tf

    try:
        return tf.io.gfile.stat(path).length
    except tf.errors.NotFoundError:
        return None


def _bad(piece: Piece, found: str) -> DataError:
    return DataError(
        f"{piece.path}: {found}, expected {piece.size} bytes ({piece.records} records) of work "
        f"unit {piece.unit} for output shard {piece.shard}; no output shard written"
    )


def check(pieces: list[Piece]) -> None:
    """DataError naming the first of ``pieces`` that is missing or not of its size."""
    with concurrent.futures.ThreadPoolExecutor(_STAT_THREADS) as pool:
        sizes = list(pool.map(_size, [piece.path for piece in pieces]))
    for piece, size in zip(pieces, sizes, strict=True):
        if size != piece.size:
            raise _bad(piece, "missing" if size is None else f"{size} bytes")


def append(piece: Piece, output) -> None:
    """Appends ``piece`` to the open binary ``output`` (TFRecord files are self-delimiting, so
    concatenated files are one valid file); DataError unless it is still there and its bytes and
    frames are what its unit wrote."""
    frames = _Frames()
    try:
        with sources.open_file(piece.path) as f:
            while chunk := f.read(_COPY_BYTES):
                frames.add(chunk)
                output.write(chunk)
    except (FileNotFoundError, _not_found()):
        raise _bad(piece, "missing") from None
    if frames.size != piece.size:
        raise _bad(piece, f"{frames.size} bytes")
    records = frames.records()
    if records != piece.records:
        raise _bad(piece, "not whole TFRecords" if records is None else f"{records} TFRecords")


def _not_found() -> type[Exception]:
    tf = sys.modules.get("tensorflow")  # only a gs:// piece (TensorFlow imported) raises this
    return tf.errors.NotFoundError if tf is not None else FileNotFoundError


class _Frames:
    """Counts TFRecord frames (8-byte length, 4-byte CRC, data, 4-byte CRC) in a byte stream."""

    def __init__(self):
        self.size = 0  # bytes seen
        self.next = 0  # where the next frame starts
        self.count = 0
        self.partial = b""  # the start of a length split between chunks

    def add(self, chunk: bytes) -> None:
        start, self.size = self.size, self.size + len(chunk)
        while self.next < self.size:
            at = max(self.next - start, 0)
            header = self.partial + chunk[at : at + 8 - len(self.partial)]
            if len(header) < 8:
                self.partial = header
                return
            self.partial = b""
            self.next += 16 + struct.unpack("<Q", header)[0]
            self.count += 1

    def records(self) -> int | None:
        """Frames seen, or None when the stream does not end at a frame's end."""
        return self.count if self.next == self.size and not self.partial else None
