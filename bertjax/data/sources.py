"""Where pretraining rows come from: input globs, the tokenizer, the cached instance table for
text/TFDS corpora, and pre-generated TFRecords in the original BERT format (a corpus cut into
work units for the offline builder: ``bertjax.data.work_units``). No JAX.

Instance table: the unmasked rows of ``instances.generate_instances`` (``<int32>[N, L+4]``)
in one raw file under ``data.cache_dir`` (default ``$TMPDIR/bertjax_data_cache``), named by a
fingerprint of everything that determines it (input files with sizes and mtimes, the vocab's
bytes, tokenizer settings, pairing settings, seed, split). It is written atomically
(``bertjax.atomic``), with a ``.json`` sidecar (row count and statistics) written last, so a
killed build is never taken as valid. Rows are read with ``os.pread`` (no mmap), so resident
memory does not grow with it.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import tempfile

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


def _content_sha256(path: str) -> str:
    """A small file's identity in the cache key: the sha256 of its bytes."""
    if is_local(path):
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


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
    key = [
        _FORMAT_VERSION,
        inputs,
        # By content: a resumed continued run reads its workdir's copy of the same vocab.
        _content_sha256(data_config.vocab_file),
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
