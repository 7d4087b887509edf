"""Work units: a text corpus cut at document starts into pieces processed independently.

The offline builder (``bertjax.data.offline``, locally or on Beam) and the vocab builder on Beam
run one unit at a time in their workers. The cut itself runs in the workers too, in two steps, so
that no process reads the whole corpus alone:

1. ``spans(files, unit_bytes)``, from file sizes only (one metadata call per file, no reading),
   with ``chunk = max(unit_bytes, MIN_SPAN_BYTES)``: consecutive files smaller than ``chunk`` are
   grouped until the group reaches it; a larger plain file is split into ``size // chunk`` byte
   ranges of equal nominal size; a larger ``.gz`` file is one span (a gzip stream cannot be
   entered in the middle).
2. ``cut_span(span, unit_bytes)``, in a worker: a range's ends move forward to the first document
   start at or after them (``document_start_at``: the first non-blank line after a blank line
   that begins there; the same function for both neighbours, so no document is split or read
   twice), and the span's text is cut into units of at least ``unit_bytes`` and 2 documents (so
   NotNext pairs can be drawn inside a unit), its remainder joining its last unit. With
   ``split_dir``, each range of a ``.gz`` file is also written there as a plain piece
   (``WorkUnit.pieces``): the span's one decompression serves all its units.
3. ``stitch(cut_spans)``, wherever the cut spans meet: units in span order, numbered; a unit with
   fewer than 2 documents (a whole span that had them) joins its neighbour.

So units are a pure function of the files (as stored: a ``.gz`` file larger than a span is cut
as one, its plain twin in several) and ``unit_bytes``, whoever cuts which span; ``work_units``
does all three steps in one process. A document starts at a non-blank line that
follows a blank one (or the start of a file).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import os
import secrets
import zlib
from collections.abc import Iterable, Iterator

import numpy as np

from bertjax.data import instances, sources
from bertjax.data.instances import DataError

# A span's least nominal size: finding a range's ends reads on to the next document start, so
# spans much smaller than a document would be mostly that search (and many would be empty).
MIN_SPAN_BYTES = 1 << 16


@dataclasses.dataclass(frozen=True)
class Span:
    """``ranges``: ``(file, start, stop)`` nominal byte ranges (``stop`` None: to the file's end;
    a ``.gz`` file only whole). ``index``: the span's place in the corpus. ``size``: its bytes on
    storage (compressed, for ``.gz``)."""

    index: int
    ranges: tuple[tuple[str, int, int | None], ...]
    size: int


@dataclasses.dataclass(frozen=True)
class WorkUnit:
    """Whole documents of ``ranges`` (``(file, start byte, stop byte)`` of the decompressed
    text, in order; a range ends at a document end). ``index`` is the unit's place in the corpus.
    ``pieces`` (empty, or one per range): a file holding exactly that range's bytes, its split
    copy (a ``.gz`` input's), or None to read ``file`` itself. ``documents``: how many."""

    index: int
    ranges: tuple[tuple[str, int, int], ...]
    pieces: tuple[str | None, ...] = ()
    documents: int = 0

    def describe(self) -> str:
        return ", ".join(f"{path} bytes {start}-{stop}" for path, start, stop in self.ranges)

    def joined(self, other: WorkUnit) -> WorkUnit:
        """This unit with ``other``'s ranges after its own (and their pieces)."""
        pieces = (*self.pieces_or_none(), *other.pieces_or_none())
        ranges, documents = self.ranges + other.ranges, self.documents + other.documents
        return WorkUnit(self.index, ranges, pieces, documents)

    def pieces_or_none(self) -> tuple[str | None, ...]:
        return self.pieces or (None,) * len(self.ranges)


def _size(path: str) -> int:
    if sources.is_local(path):
        return os.path.getsize(path)
    import tensorflow as tf

    return tf.io.gfile.stat(path).length


def spans(files: list[str], unit_bytes: int) -> list[Span]:
    """Step 1 (module docstring): the corpus's spans, from the files' sizes."""
    result: list[tuple] = []  # (ranges, size)
    group, group_bytes = [], 0
    chunk = max(unit_bytes, MIN_SPAN_BYTES)

    def close_group():
        nonlocal group, group_bytes
        if group:
            result.append((tuple(group), group_bytes))
        group, group_bytes = [], 0

    for path in files:
        size = _size(path)
        if size < chunk:
            group.append((path, 0, None))
            group_bytes += size
            if group_bytes >= chunk:
                close_group()
            continue
        close_group()
        if path.endswith(".gz"):
            result.append((((path, 0, None),), size))
            continue
        count = size // chunk
        bounds = [size * k // count for k in range(count + 1)]
        result.extend((((path, a, b),), b - a) for a, b in zip(bounds, bounds[1:], strict=False))
    close_group()
    return [Span(i, ranges, size) for i, (ranges, size) in enumerate(result)]


def estimated_units(spans_: list[Span], unit_bytes: int) -> int:
    """The units ``spans_`` will make, before any is read: at least one per span and one per
    ``unit_bytes`` of storage (a ``.gz`` file's text is larger: an underestimate there)."""
    return sum(max(1, span.size // unit_bytes) for span in spans_)


@contextlib.contextmanager
def _open_text(path: str):
    """A binary, seekable stream of a text file's contents (gzip'd when the name ends in .gz)."""
    with sources.open_file(path) as raw:
        if not path.endswith(".gz"):
            yield raw
            return
        with gzip.GzipFile(fileobj=raw) as text:
            yield text


def document_start_at(f, position: int) -> int:
    """The first document start at or after byte ``position`` of the open plain file ``f``: the
    first non-blank line after a blank line, both beginning there (0 at 0; the file's size when
    there is none)."""
    if position == 0:
        return 0
    f.seek(position - 1)
    position += len(f.readline()) - 1  # the first line start at or after it
    after_blank = False
    for line in f:
        blank = not line.strip()
        if not blank and after_blank:
            return position
        after_blank = blank
        position += len(line)
    return position


class _Splitter:
    """Copies a ``.gz`` input's decompressed lines into one plain piece per range under
    ``directory`` (local or ``gs://``), so that a unit reads its own bytes, never decompressing
    its file from the start (that would make a file of N units cost N^2/2 units of inflating).
    A piece's name holds this cut's own random id: a span cut twice (a retried or duplicated
    attempt) writes other names, and a unit reads only the pieces its committed cut named."""

    def __init__(self, directory: str | None, span: int):
        self.directory, self.span, self.count, self.file, self.buffer = directory, span, 0, None, []
        self.attempt = secrets.token_hex(6)

    def _name(self, count: int) -> str:
        return f"{self.directory}/text-{self.span:06d}-{count:06d}-{self.attempt}"

    def start(self, path: str) -> None:
        if self.directory and path.endswith(".gz"):
            self.file = sources.open_file(self._name(self.count), "wb")
            self.count += 1

    def write(self, line: bytes) -> None:
        if self.file is not None:
            self.buffer.append(line)
            if len(self.buffer) >= 4096:  # one storage write per few hundred kB, not per line
                self.file.write(b"".join(self.buffer))
                self.buffer = []

    def finish(self) -> str | None:
        """Closes the current piece; returns its path (None when this range is not split)."""
        if self.file is None:
            return None
        self.file.write(b"".join(self.buffer))
        self.file.close()
        self.file, self.buffer = None, []
        return self._name(self.count - 1)


def cut_span(span: Span, unit_bytes: int, split_dir: str | None = None) -> list[WorkUnit]:
    """Step 2 (module docstring): the span's units, numbered -1 until ``stitch``."""
    units, ranges, pieces = [], [], []  # ranges of the unit being built, and their pieces
    size = documents = 0
    splitter = _Splitter(split_dir, span.index)
    for path, nominal_start, nominal_stop in span.ranges:
        try:
            with _open_text(path) as f:
                start = document_start_at(f, nominal_start)
                stop = None if nominal_stop is None else document_start_at(f, nominal_stop)
                f.seek(start)
                position, after_blank = start, True
                splitter.start(path)
                for line in f:
                    if stop is not None and position >= stop:
                        break
                    blank = not line.strip()
                    if not blank and after_blank:  # a document starts here
                        if size + position - start >= unit_bytes and documents >= 2:
                            ranges.append((path, start, position))
                            pieces.append(splitter.finish())
                            units.append(WorkUnit(-1, tuple(ranges), tuple(pieces), documents))
                            ranges, pieces, size, documents, start = [], [], 0, 0, position
                            splitter.start(path)
                        documents += 1
                    after_blank = blank
                    position += len(line)
                    splitter.write(line)
        except (OSError, EOFError, zlib.error) as e:  # zlib.error: corrupt gzip data
            raise DataError(f"{path}: cannot read ({e})") from None
        piece = splitter.finish()
        if position > start:
            ranges.append((path, start, position))
            pieces.append(piece)
            size += position - start
    if ranges:
        rest = WorkUnit(-1, tuple(ranges), tuple(pieces), documents)
        if documents < 2 and units:  # too small to pair on its own: join the previous unit
            units[-1] = units[-1].joined(rest)
        else:
            units.append(rest)
    return units


def stitch(cut_spans: Iterable[list[WorkUnit]]) -> list[WorkUnit]:
    """Step 3 (module docstring): the spans' units in order, numbered from 0."""
    units: list[WorkUnit] = []
    for unit in (unit for span_units in cut_spans for unit in span_units):
        if units and (unit.documents < 2 or units[-1].documents < 2):
            units[-1] = units[-1].joined(unit)
        else:
            units.append(unit)
    return [dataclasses.replace(unit, index=i) for i, unit in enumerate(units)]


def work_units(files: list[str], unit_bytes: int, split_dir: str | None = None) -> list[WorkUnit]:
    """The corpus's units, every step in this process (module docstring)."""
    return stitch(cut_span(span, unit_bytes, split_dir) for span in spans(files, unit_bytes))


def unit_lines(unit: WorkUnit, chunk_bytes: int = 1 << 22) -> Iterator[bytes]:
    """The unit's lines (no line ends; a blank line after each range, which ends a document),
    read ``chunk_bytes`` at a time: what a worker holds does not grow with the unit. DataError
    naming the file and byte offset if the text is not UTF-8 (raised when that chunk is read)."""
    for (path, start, stop), piece in zip(unit.ranges, unit.pieces_or_none(), strict=True):
        try:
            if piece is not None:  # the range's split copy: exactly its bytes
                with sources.open_file(piece) as f:
                    yield from _range_lines(f, path, start, stop - start, chunk_bytes, piece)
            else:
                with _open_text(path) as f:
                    f.seek(start)
                    yield from _range_lines(f, path, start, stop - start, chunk_bytes, path)
        except (OSError, EOFError, zlib.error) as e:  # zlib.error: corrupt gzip data
            raise DataError(f"{path}: cannot read ({e})") from None
        yield b""


def _range_lines(
    f, path: str, start: int, size: int, chunk_bytes: int, source: str
) -> Iterator[bytes]:
    """The lines of the next ``size`` bytes of ``f`` (byte ``start`` of ``path``, read from
    ``source``: ``path`` or its piece), as ``text.split(b"\\n")`` gives them, ``\\r`` stripped.
    A chunk is checked up to its last line end, which never falls inside a UTF-8 character.
    DataError naming ``source`` if it ends early (a lost or partial piece, a file cut short)."""
    carry, done = b"", 0
    while done < size:
        chunk = f.read(min(chunk_bytes, size - done))
        if not chunk:
            raise DataError(
                f"{source}: ends after {done} of the {size} bytes of {path} from byte {start}"
            )
        text, done = carry + chunk, done + len(chunk)
        cut = text.rfind(b"\n")
        if cut < 0:
            carry = text
            continue
        _check_utf8(text[:cut], path, start + done - len(text))
        yield from (line.rstrip(b"\r") for line in text[:cut].split(b"\n"))
        carry = text[cut + 1 :]
    _check_utf8(carry, path, start + done - len(carry))
    yield carry.rstrip(b"\r")


def _check_utf8(text: bytes, path: str, offset: int) -> None:
    """DataError naming ``path`` and the byte unless ``text`` (at byte ``offset``) is UTF-8."""
    try:
        text.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {offset + e.start})") from None


def line_batches(unit: WorkUnit, batch_lines: int) -> Iterator[list[bytes]]:
    """``unit_lines`` in lists of ``batch_lines`` (the last may be shorter)."""
    batch = []
    for line in unit_lines(unit):
        batch.append(line)
        if len(batch) == batch_lines:
            yield batch
            batch = []
    if batch:
        yield batch


def unit_documents(unit: WorkUnit, tokenize, batch_lines: int = 2048) -> Iterator:
    """Tokenized documents of ``unit`` (as ``instances.read_text_documents`` makes them), read
    and tokenized ``batch_lines`` at a time (``tokenize``: ``instances.line_batch_tokenizer``)."""
    batches = (tokenize(np.array(lines, dtype=object)) for lines in line_batches(unit, batch_lines))
    return instances.documents_from_batches(batches, unit.describe())
