"""Atomic writes on a local disk and on object stores (``gs://``): readers see the old content or
the new, never part of it. Every module that writes an output file uses this one.

Paths go through ``etils.epath`` (a path with ``://`` is an object store: ``gs://``, and alike
``s3://``); this module imports nothing else of bertjax, so every stage may use it.

**A file** (:func:`write_bytes`, :func:`write_text`, :func:`writer` for streaming):

* *local disk*: the bytes go to a temporary file in the destination's directory,
  ``.NAME.tmp-XXXXXXXX`` (so the rename never crosses filesystems), which is flushed and
  ``fsync``-ed, then ``os.replace``-d onto ``NAME`` (atomic on POSIX), and the directory is
  ``fsync``-ed so the rename survives a power cut. On an exception the temporary is removed and
  ``NAME`` keeps its old content; a killed process can leave a ``.NAME.tmp-*`` behind, which no
  reader opens.
* *object store*: an object becomes visible only when its upload completes, and a failed or
  killed upload never replaces it. So the object is written directly, once, with its complete
  content: :func:`writer` spools to a local temporary file and uploads it on success (nothing is
  uploaded on an exception). It never renames: a GCS "rename" is a copy and a delete, and a
  "directory" rename copies every object one by one, never atomically. Writers of a store's
  file objects upload what they hold when closed, even on an exception, which is why the
  destination is opened only once the content is complete.

**A directory** (:func:`directory`: the caller fills a local staging directory; ``last`` names
the entries readers check to know the rest is complete, e.g. ``eval_results.json``):

* *local disk*: ``replace=True`` renames the staging directory onto the destination (the old one
  is renamed aside first and removed after): readers see the old directory, briefly none, or
  the new one. ``replace=False`` merges the entries into an existing directory, each by one
  rename, the ``last`` ones last.
* *object store*: nothing is atomic across objects. The ``last`` objects the stage brings are
  deleted first (with ``replace=True`` the whole old prefix is), then every other file is
  uploaded, then the ``last`` ones: a reader that checks ``last`` first never takes a mixture
  for complete. Merging, an entry that is a directory replaces the old one as locally: the old
  prefix's objects are deleted before the new ones are uploaded.

Failures raise the store's own ``OSError`` (callers turn it into their one-line message).
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import IO

from etils import epath


def is_object_store(path: str | os.PathLike) -> bool:
    """``gs://...`` (any ``scheme://``): objects, no directories, no atomic rename."""
    return "://" in os.fspath(path)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Writes ``data`` to ``path`` atomically (module docstring)."""
    with writer(path, "wb") as f:
        f.write(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Writes ``text`` as UTF-8 to ``path`` atomically (module docstring)."""
    write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def writer(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """A file to stream into (``mode`` 'wb', or 'w' for UTF-8 text); on a clean exit it replaces
    ``path`` atomically, on an exception ``path`` is left as it was (module docstring)."""
    if mode not in ("wb", "w"):
        raise ValueError(f"mode={mode!r}: expected 'wb' or 'w'")
    path = os.fspath(path)
    remote = is_object_store(path)
    if remote:  # a local spool, uploaded whole (fsync-ing it would buy nothing)
        fd, tmp = tempfile.mkstemp(prefix="bertjax-upload-")
    else:
        directory, name = os.path.split(os.path.abspath(path))
        tmp = os.path.join(directory, f".{name}.tmp-{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # umask applies
    try:
        with open(fd, "wb") as raw:
            if mode == "w":
                text = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
                yield text
                text.detach()  # flushes; raw stays open for the fsync below
            else:
                yield raw
            raw.flush()
            if not remote:
                os.fsync(raw.fileno())
        if remote:
            epath.Path(tmp).copy(epath.Path(path), overwrite=True)  # one complete upload
        else:
            os.replace(tmp, path)
            _sync_directory(os.path.dirname(os.path.abspath(path)))
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _sync_directory(directory: str) -> None:
    """Makes a rename in ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems (and platforms) do not fsync directories
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def directory(
    dst: str | os.PathLike, *, last: Sequence[str] = (), replace: bool = False
) -> Iterator[str]:
    """A local staging directory to fill; on a clean exit its entries land in ``dst`` (module
    docstring: ``replace`` swaps the whole directory, else entries are merged in; the ``last``
    entries land last), on an exception nothing is changed and the stage is removed."""
    dst = os.fspath(dst)
    remote = is_object_store(dst)
    if remote:
        stage = tempfile.mkdtemp(prefix="bertjax-upload-")
    else:  # beside (or in) dst, so every rename stays on one filesystem
        parent, name = os.path.split(os.path.abspath(dst))
        where = (
            os.path.join(parent, f".{name}.tmp-") if replace else os.path.join(dst, ".staged.tmp-")
        )
        stage = where + secrets.token_hex(4)
        os.makedirs(stage)  # not mkdtemp: with replace the stage becomes dst, with usual modes
    try:
        yield stage
        if remote:
            _upload(stage, epath.Path(dst), last, replace)
        elif replace:
            _swap(stage, os.path.abspath(dst))
        else:
            _merge(stage, dst, last)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _ordered(names: list[str], last: Sequence[str]) -> list[str]:
    """``names`` with those in ``last`` at the end, in ``last``'s order."""
    return sorted(names, key=lambda n: (n in last, last.index(n) if n in last else 0, n))


def _swap(stage: str, dst: str) -> None:
    parent, name = os.path.split(dst)
    aside = os.path.join(parent, f".{name}.old-{secrets.token_hex(4)}")
    if os.path.lexists(dst):
        os.rename(dst, aside)
    os.rename(stage, dst)
    _sync_directory(parent)
    shutil.rmtree(aside, ignore_errors=True)


def _merge(stage: str, dst: str, last: Sequence[str]) -> None:
    names = _ordered(os.listdir(stage), last)
    for name in [n for n in names if n in last]:  # no old marker beside new, partial entries
        _remove(os.path.join(dst, name))
    for name in names:
        target = os.path.join(dst, name)
        _remove(target)
        os.replace(os.path.join(stage, name), target)
    _sync_directory(dst)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def _upload(stage: str, dst: epath.Path, last: Sequence[str], replace: bool) -> None:
    names = _ordered(os.listdir(stage), last)
    for name in [n for n in names if n in last]:  # no old marker beside new, partial objects
        _delete(dst / name)
    if replace and dst.exists():
        dst.rmtree()
    for name in names:
        source = os.path.join(stage, name)
        if not replace and os.path.isdir(source):  # as _merge: none of the old entry's objects
            _delete(dst / name)  # stays among the new ones (a checkpoint's would not verify)
        files = [source] if not os.path.isdir(source) else sorted(
            os.path.join(root, f) for root, _, fs in os.walk(source) for f in fs
        )  # fmt: skip
        for file in files:  # each object: one complete upload (no parent "directory" needed)
            epath.Path(file).copy(dst / os.path.relpath(file, stage), overwrite=True)


def _delete(path: epath.Path) -> None:
    """Deletes an object, or every object under a prefix; nothing there is fine."""
    if path.is_dir():
        path.rmtree()
    elif path.exists():
        path.unlink()
