"""Where pretraining rows come from: input globs, the tokenizer, the cached instance table for
text/TFDS corpora, and pre-generated TFRecords in the original BERT format. No JAX.

Instance table: the unmasked rows of ``instances.generate_instances`` (``<int32>[N, L+4]``)
in one raw file under ``data.cache_dir`` (default ``$TMPDIR/bertjax_data_cache``), named by a
fingerprint of everything that determines it (input files with sizes and mtimes, vocab, tokenizer
settings, pairing settings, seed, split). It is written atomically (``bertjax.atomic``), with a
``.json`` sidecar (row count and statistics) written last, so a killed build is never taken as
valid. Rows are read with ``os.pread`` (no mmap), so resident memory does not grow with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import gzip
import hashlib
import json
import os
import tempfile
import zlib

import numpy as np

from bertjax import atomic
from bertjax.data import instances
from bertjax.data.instances import DataError

_FORMAT_VERSION = 3  # bump when pairing or the row layout changes: old caches are ignored


def file_patterns(value, field: str) -> list[str]:
    """``config.data.<field>`` as a list of globs.

    Accepts a list/tuple of globs or one string of comma-separated globs (what a command-line
    override ``--config.data.input_files=a.txt,b/*.txt`` gives, since config_flags cannot parse
    a list); list items are split on commas too, like the original's ``--input_file``.
    """
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
        raise DataError(
            f"data.{field}={value!r}: expected a glob, comma-separated globs or a list of globs"
        )
    patterns = [p.strip() for item in items for p in item.split(",") if p.strip()]
    if not patterns:
        raise DataError(f"data.{field}={value!r}: no file pattern given")
    return patterns


def is_local(path: str) -> bool:
    """Local paths are handled without TensorFlow (importing it costs seconds per process);
    others (``gs://...``) go through ``tf.io.gfile``."""
    return "://" not in path


def open_file(path: str, mode: str = "rb"):
    """A binary file object for a local or ``tf.io.gfile`` path."""
    if is_local(path):
        return open(path, mode)
    import tensorflow as tf

    return tf.io.gfile.GFile(path, mode)


def _size_and_mtime(path: str) -> tuple[int, float]:
    """What identifies a file's version in the cache key: its size and modification time."""
    if is_local(path):
        return os.path.getsize(path), os.path.getmtime(path)
    import tensorflow as tf

    stat = tf.io.gfile.stat(path)  # one metadata request on gs://
    return stat.length, stat.mtime_nsec / 1e9


def _glob(pattern: str) -> list[str]:
    if is_local(pattern):
        return [f for f in glob.glob(pattern) if os.path.isfile(f)]
    import tensorflow as tf

    return tf.io.gfile.glob(pattern)


def resolve_files(value, field: str) -> list[str]:
    """Sorted files matching ``file_patterns(value)``; DataError naming ``field`` if none."""
    patterns = file_patterns(value, field)
    files = sorted({f for p in patterns for f in _glob(p)})
    if not files:
        raise DataError(f"data.{field}={list(patterns)!r}: no file matches")
    return files


def create_tokenizer(data_config):
    """The ``config.data`` tokenizer; a vocab problem becomes a DataError naming the file."""
    from bertjax.data import tokenization

    try:
        return tokenization.create_tokenizer(
            data_config.tokenizer, data_config.vocab_file, data_config.do_lower_case
        )
    except tokenization.TokenizerError as e:
        raise DataError(f"data.vocab_file: {e}") from None


def instance_options(data_config, tokenizer) -> instances.InstanceOptions:
    return instances.InstanceOptions(
        max_seq_length=int(data_config.max_seq_length),
        short_seq_prob=float(data_config.short_seq_prob),
        nsp=bool(data_config.nsp),
        dupe_factor=int(data_config.dupe_factor),
        random_doc_pool=int(data_config.random_doc_pool),
        split_single_sentence=bool(data_config.split_single_sentence),
        cls_id=tokenizer.cls_id,
        sep_id=tokenizer.sep_id,
        pad_id=tokenizer.pad_id,
    )


def read_documents(data_config, tokenizer, split: str):
    """(documents iterator, source description) for a text or TFDS ``split``."""
    if data_config.source == "tfds":
        tfds_split = data_config.tfds_split if split == "train" else data_config.tfds_eval_split
        lines = instances.tfds_line_dataset(
            data_config.tfds_name,
            tfds_split,
            data_config.tfds_data_dir,
            data_config.tfds_text_field,
        )
        source = f"tfds {data_config.tfds_name}:{tfds_split}"
        batches = instances.tokenized_line_batches(lines, tokenizer)
        return instances.documents_from_batches(batches, source), source
    field = "input_files" if split == "train" else "eval_input_files"
    files = resolve_files(getattr(data_config, field), field)
    return instances.read_text_documents(files, tokenizer), f"data.{field} {files}"


@dataclasses.dataclass
class InstanceTable:
    """Fixed-size ``<int32>[L + 4]`` rows in a raw file; ``meta`` holds counts and stats."""

    path: str
    row_length: int
    num_rows: int
    meta: dict

    def num_tokens(self) -> np.ndarray:
        """``<int64>[num_rows]``: every instance's length (its [CLS] A [SEP] B [SEP] tokens)."""
        if not self.num_rows:
            return np.zeros(0, np.int64)
        rows = np.memmap(self.path, np.int32, "r", shape=(self.num_rows, self.row_length))
        length = self.row_length - instances.NUM_META
        return np.asarray(rows[:, length + instances.META_NUM_TOKENS], np.int64)

    def read(self, rows: np.ndarray) -> np.ndarray:
        """``<int64>[R]`` row indices -> ``<int32>[R, L + 4]``."""
        nbytes = self.row_length * 4
        out = np.empty((len(rows), self.row_length), dtype=np.int32)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for i, row in enumerate(rows.tolist()):
                out[i] = np.frombuffer(os.pread(fd, nbytes, row * nbytes), dtype=np.int32)
        finally:
            os.close(fd)
        return out


def _fingerprint(data_config, split: str, seed: int) -> str:
    if data_config.source == "tfds":
        inputs = [
            data_config.tfds_name,
            data_config.tfds_data_dir,
            data_config.tfds_text_field,
            data_config.tfds_split if split == "train" else data_config.tfds_eval_split,
        ]
    else:
        field = "input_files" if split == "train" else "eval_input_files"
        files = resolve_files(getattr(data_config, field), field)
        inputs = [(f, *_size_and_mtime(f)) for f in files]
    vocab = data_config.vocab_file
    key = [
        _FORMAT_VERSION,
        inputs,
        vocab,
        *_size_and_mtime(vocab),
        data_config.tokenizer,
        data_config.do_lower_case,
        data_config.max_seq_length,
        data_config.short_seq_prob,
        data_config.nsp,
        data_config.dupe_factor,
        data_config.random_doc_pool,
        data_config.split_single_sentence,
        seed,
        split,
    ]
    return hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()[:20]


def _summarise(block: np.ndarray, length: int, unk_id: int, stats: dict) -> None:
    meta = block[:, length:]
    stats["instances"] += len(block)
    stats["tokens"] += int(meta[:, instances.META_NUM_TOKENS].sum())
    stats["not_next"] += int(meta[:, instances.META_LABEL].sum())
    stats["truncated"] += int(meta[:, instances.META_TRUNCATED].sum())
    stats["unk"] += int((block[:, :length] == unk_id).sum())


def write_table(blocks, path: str, length: int, unk_id: int) -> dict:
    """Streams instance blocks to ``path`` atomically; returns the statistics written beside it."""
    stats = dict(instances=0, tokens=0, not_next=0, truncated=0, unk=0)
    with atomic.writer(path, "wb") as f:
        for block in blocks:
            f.write(np.ascontiguousarray(block, dtype=np.int32).tobytes())
            _summarise(block, length, unk_id, stats)
    return stats


def open_or_build(data_config, tokenizer, split: str, seed: int) -> InstanceTable:
    """The cached instance table of ``split``, building it first if needed (deterministic)."""
    cache_dir = data_config.cache_dir or os.path.join(tempfile.gettempdir(), "bertjax_data_cache")
    os.makedirs(cache_dir, exist_ok=True)
    base = os.path.join(cache_dir, f"instances-{_fingerprint(data_config, split, seed)}")
    row_length = data_config.max_seq_length + instances.NUM_META
    if not os.path.exists(base + ".json"):
        documents, source = read_documents(data_config, tokenizer, split)
        options = instance_options(data_config, tokenizer)
        blocks = instances.generate_instances(documents, seed, options, source)
        stats = write_table(blocks, base + ".rows", data_config.max_seq_length, tokenizer.unk_id)
        stats["source"] = source
        atomic.write_text(base + ".json", json.dumps(stats))
    with open(base + ".json") as f:
        meta = json.load(f)
    num_rows = os.path.getsize(base + ".rows") // (4 * row_length)
    if num_rows != meta["instances"]:
        raise DataError(
            f"instance cache {base}.rows: {num_rows} rows, expected "
            f"{meta['instances']}; delete it to rebuild"
        )
    return InstanceTable(base + ".rows", row_length, num_rows, meta)


# ---- work units: a text corpus cut at document boundaries into pieces that can be processed
# ---- independently (bertjax.create_pretraining_data runs them in parallel processes)


@dataclasses.dataclass(frozen=True)
class WorkUnit:
    """Whole documents of ``ranges`` (``(file, start byte, stop byte)`` of the decompressed
    text, in order; a range ends at a document end). ``index`` is the unit's place in the corpus.
    ``pieces`` (empty, or one per range): a file holding exactly that range's bytes, its split
    copy (a ``.gz`` input's, ``work_units(split_dir=...)``), or None to read ``file`` itself."""

    index: int
    ranges: tuple[tuple[str, int, int], ...]
    pieces: tuple[str | None, ...] = ()

    def describe(self) -> str:
        return ", ".join(f"{path} bytes {start}-{stop}" for path, start, stop in self.ranges)

    def joined(self, other: WorkUnit) -> WorkUnit:
        """This unit with ``other``'s ranges after its own (and their pieces)."""
        pieces = (*self.pieces_or_none(), *other.pieces_or_none())
        return WorkUnit(self.index, self.ranges + other.ranges, pieces)

    def pieces_or_none(self) -> tuple[str | None, ...]:
        return self.pieces or (None,) * len(self.ranges)


@contextlib.contextmanager
def _open_text(path: str):
    """A binary, seekable stream of a text file's contents (gzip'd when the name ends in .gz)."""
    with open_file(path) as raw:
        if not path.endswith(".gz"):
            yield raw
            return
        with gzip.GzipFile(fileobj=raw) as text:
            yield text


class _Splitter:
    """Copies a ``.gz`` input's decompressed lines into one plain piece per range under
    ``directory`` (local or ``gs://``), so that a unit reads its own bytes, never decompressing
    its file from the start (that would make a file of N units cost N^2/2 units of inflating)."""

    def __init__(self, directory: str | None):
        self.directory, self.count, self.file, self.buffer = directory, 0, None, []

    def start(self, path: str) -> None:
        if self.directory and path.endswith(".gz"):
            self.file = open_file(f"{self.directory}/text-{self.count:06d}", "wb")
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
        return f"{self.directory}/text-{self.count - 1:06d}"


def work_units(files: list[str], unit_bytes: int, split_dir: str | None = None) -> list[WorkUnit]:
    """Cuts the corpus into units of at least ``unit_bytes`` bytes and 2 documents (so NotNext
    pairs can be drawn inside a unit), at document starts; the last unit absorbs a remainder
    with fewer than 2 documents. A pure function of the files and ``unit_bytes``.

    One pass reading lines without tokenizing (a few hundred MB/s); a document starts at a
    non-blank line that follows a blank one (or the start of a file). With ``split_dir``, each
    range of a ``.gz`` file is also written there as a plain piece (``WorkUnit.pieces``): the
    one decompression of the file that this pass makes anyway serves every unit.
    """
    units, ranges, pieces = [], [], []  # ranges of the unit being built, and their pieces
    size = documents = 0
    splitter = _Splitter(split_dir)
    for path in files:
        start = position = 0
        after_blank = True
        try:
            with _open_text(path) as f:
                splitter.start(path)
                for line in f:
                    blank = not line.strip()
                    if not blank and after_blank:  # a document starts here
                        if size + position - start >= unit_bytes and documents >= 2:
                            ranges.append((path, start, position))
                            pieces.append(splitter.finish())
                            units.append(WorkUnit(len(units), tuple(ranges), tuple(pieces)))
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
        rest = WorkUnit(len(units), tuple(ranges), tuple(pieces))
        if documents < 2 and units:  # too small to pair on its own: join the previous unit
            units[-1] = units[-1].joined(rest)
        else:
            units.append(rest)
    return units


def unit_lines(unit: WorkUnit) -> list[bytes]:
    """The unit's lines (no line ends; a blank line after each range, which ends a document).
    DataError naming the file and byte offset if the text is not UTF-8."""
    lines = []
    for (path, start, stop), piece in zip(unit.ranges, unit.pieces_or_none(), strict=True):
        try:
            if piece is not None:  # the range's split copy: exactly its bytes
                with open_file(piece) as f:
                    text = f.read()
            else:
                with _open_text(path) as f:
                    f.seek(start)
                    text = f.read(stop - start)
        except (OSError, EOFError, zlib.error) as e:  # zlib.error: corrupt gzip data
            raise DataError(f"{path}: cannot read ({e})") from None
        try:
            text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: not UTF-8 text (byte {start + e.start})") from None
        lines.extend(line.rstrip(b"\r") for line in text.split(b"\n"))
        lines.append(b"")
    return lines


def unit_documents(unit: WorkUnit, tokenize, batch_lines: int = 2048):
    """Tokenized documents of ``unit`` (as ``instances.read_text_documents`` makes them);
    ``tokenize`` is a ``instances.line_batch_tokenizer``."""
    lines = unit_lines(unit)
    batches = (
        tokenize(np.array(lines[i : i + batch_lines], dtype=object))
        for i in range(0, len(lines), batch_lines)
    )
    return instances.documents_from_batches(batches, unit.describe())
