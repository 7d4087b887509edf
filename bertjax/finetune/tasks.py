"""What every fine-tuning task provides, and the pieces they share (reading, packing, errors).

A task (``glue.GlueTask``, ``squad.SquadTask``, ``ner.NerTask``, ``swag.SwagTask``) has::

    name, head        head in HEADS: which model of ``bertjax.model.heads`` and which loss
    num_labels        classes per example (classification, tagging); 1 for regression
    train_split       the split name fine-tuned on; dev_splits / test_splits: evaluated / predicted
    primary_metric    the dev metric the learning-rate sweep selects by
    has_split(data_dir, split)            -> whether the split's data is there (its file)
    read(data_dir, split)                 -> list of examples (task-specific dataclasses)
    featurize(examples, tokenizer, cfg)   -> Features
    evaluate(examples, features, logits)  -> (metrics dict, predictions object)
    write_predictions(out_dir, split, examples, features, logits, with_labels) -> list of paths

Features are the model inputs as numpy arrays with a leading feature dimension N (one example can
give several features: SQuAD's doc-stride windows)::

    input_ids, segment_ids, input_mask   <int32>[N, L]  (<int32>[N, C, L] for multiple choice)
    label_ids     classification / choice <int32>[N]; regression <float32>[N];
                  tagging <int32>[N, L]; span: start_positions, end_positions <int32>[N]
    label_weights tagging only: <float32>[N, L], 1 on the first WordPiece of each word

Skips that the official scripts also make (e.g. a SQuAD answer that cannot be recovered from the
whitespace tokens, QQP lines with missing columns) are counted in ``Features.skipped`` / the
task's ``skipped`` dict and reported in the metrics JSON; everything else malformed is a
:class:`FinetuneInputError` naming the file and line. Task files are read through
:func:`read_text` and looked for with ``etils.epath``: ``config.task.data_dir`` may be on ``gs://``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import sys
from collections.abc import Sequence

import numpy as np
from etils import epath

HEADS = ("classification", "regression", "span", "tagging", "choice")
DATA_SOURCES = ("files", "tfds")  # config.task.source


class FinetuneInputError(ValueError):
    """Bad fine-tuning input: a data file, a label or a config value that does not fit."""


class Task:
    """Base of the task classes: a split is there when its standard file is."""

    label_list: Sequence[str] | None = None  # class names by id (classification, tagging)

    def record(self) -> dict:
        """What a fine-tuned checkpoint records of its task (``bertjax.training.checkpoint``):
        HF export reads the model class, ``id2label`` and ``problem_type`` from it."""
        labels = None if self.label_list is None else list(self.label_list)
        return {"name": self.name, "head": self.head, "labels": labels}

    def split_path(self, data_dir: str, split: str) -> str:
        raise NotImplementedError

    def has_split(self, data_dir: str, split: str) -> bool:
        return epath.Path(self.split_path(data_dir, split)).exists()


@dataclasses.dataclass
class Features:
    """Model inputs/targets with leading dim N, plus per-feature host-side metadata."""

    arrays: dict[str, np.ndarray]
    meta: list = dataclasses.field(default_factory=list)
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.arrays["input_ids"])


def load_tokenizer(vocab_file: str, do_lower_case: bool):
    """The checkpoint's tokenizer, by its vocab file (``checkpoint.tokenizer_kind``: WordPiece,
    SentencePiece or a BPE tokenizer.json): ``.encode``, ``.encode_words``, ``.cls_id``,
    ``.sep_id``, ``.pad_id``."""
    from bertjax.data import tokenization  # TensorFlow import: only when a task needs it.
    from bertjax.training import checkpoint  # noqa: PLC0415

    kind = checkpoint.tokenizer_kind(vocab_file)
    try:
        return tokenization.create_tokenizer(kind, vocab_file, do_lower_case)
    except tokenization.TokenizerError as e:
        raise FinetuneInputError(str(e)) from None


def read_text(path: str) -> str:
    """A task file's text (local or ``gs://``); FinetuneInputError naming it when it is missing
    or not UTF-8."""
    if not epath.Path(path).is_file():
        raise FinetuneInputError(f"{path}: file not found")
    data = epath.Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FinetuneInputError(f"{path}: not UTF-8 text (byte {e.start})") from None


def read_tsv(
    path: str, *, has_header: bool
) -> tuple[list[str] | None, list[tuple[int, list[str]]]]:
    """A GLUE TSV (tab-separated, no quoting, like the original ``csv.reader(quotechar=None)``).

    Returns the header (or None) and ``(line_number, columns)`` rows, 1-based line numbers.
    """
    csv.field_size_limit(sys.maxsize)
    lines = io.StringIO(read_text(path), newline="")  # as open(newline=""): csv splits the lines
    rows = [(i + 1, row) for i, row in enumerate(csv.reader(lines, delimiter="\t", quotechar=None))]
    rows = [(n, row) for n, row in rows if row]
    if has_header:
        if not rows:
            raise FinetuneInputError(f"{path}: empty file, expected a header line")
        return rows[0][1], rows[1:]
    return None, rows


def truncate_pair(tokens_a: list[int], tokens_b: list[int], max_tokens: int) -> None:
    """The original ``_truncate_seq_pair``: pop from the longer sequence until they fit."""
    while len(tokens_a) + len(tokens_b) > max_tokens:
        (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()


def pack(
    tokenizer, tokens_a: Sequence[int], tokens_b: Sequence[int] | None, max_seq_length: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``[CLS] a [SEP] (b [SEP])`` padded to ``max_seq_length`` -> three <int32>[L] arrays.

    The inputs must already fit (``truncate_pair`` / slicing); segment ids are 0 for a, 1 for b.
    """
    ids = [tokenizer.cls_id, *tokens_a, tokenizer.sep_id]
    segments = [0] * len(ids)
    if tokens_b is not None:
        ids += [*tokens_b, tokenizer.sep_id]
        segments += [1] * (len(tokens_b) + 1)
    if len(ids) > max_seq_length:
        raise ValueError(f"packed length {len(ids)} exceeds max_seq_length={max_seq_length}")
    pad = max_seq_length - len(ids)
    input_ids = np.asarray(ids + [tokenizer.pad_id] * pad, np.int32)
    return (
        input_ids,
        np.asarray(segments + [0] * pad, np.int32),
        np.asarray([1] * len(ids) + [0] * pad, np.int32),
    )


def stack(rows: list[dict[str, np.ndarray]], keys: Sequence[str]) -> dict[str, np.ndarray]:
    return {k: np.stack([r[k] for r in rows]) for k in keys}


def count(skipped: dict[str, int], reason: str) -> None:
    skipped[reason] = skipped.get(reason, 0) + 1


def label_index(label_list: Sequence[str], label: str, where: str) -> int:
    """The index of ``label``, or a FinetuneInputError naming ``where`` (file:line)."""
    try:
        return list(label_list).index(label)
    except ValueError:
        raise FinetuneInputError(
            f"{where}: label {label!r} is not in the label set {list(label_list)}"
        ) from None


def get_task(config):
    """The task object for ``config.task.name`` (mrpc, mnli, squad_v2, conll2003, swag, ...)."""
    import importlib

    name, known = config.task.name.lower(), []
    for module_name, class_name in (
        ("glue", "GlueTask"),
        ("squad", "SquadTask"),
        ("ner", "NerTask"),
        ("swag", "SwagTask"),
    ):
        module = importlib.import_module(f"bertjax.finetune.{module_name}")
        if name in module.TASKS:
            return _with_source(getattr(module, class_name)(name), config)
        known += list(module.TASKS)
    raise FinetuneInputError(
        f"config.task.name={config.task.name!r}: expected one of {sorted(known)}"
    )


def _with_source(task, config):
    if config.task.source not in DATA_SOURCES:
        raise FinetuneInputError(
            f"config.task.source={config.task.source!r}: expected one of {DATA_SOURCES}"
        )
    if config.task.source == "tfds":
        if not hasattr(task, "use_tfds"):
            raise FinetuneInputError(
                f"config.task.source='tfds': only the GLUE tasks have TFDS builders; "
                f"{task.name} reads its standard files from config.task.data_dir"
            )
        task.use_tfds(config.task.tfds_data_dir)
    return task
