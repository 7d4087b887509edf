"""GLUE (paper §4.1): the nine tasks' standard TSV files, features, metrics and submission files.

``config.task.data_dir`` holds one task's files as distributed by GLUE (``train.tsv``, ``dev.tsv``,
``test.tsv``; MNLI: ``dev_matched.tsv``, ``dev_mismatched.tsv``, ``test_matched.tsv``,
``test_mismatched.tsv``). Columns are read as the original ``run_classifier.py`` processors read
them; every row must have as many columns as the header (CoLA's train/dev files have no header
and 4 columns). QQP rows with missing columns are skipped and counted, as the reference scripts
do. Test predictions are written in the GLUE submission format (``index<TAB>prediction``, file
names ``CoLA.tsv``, ``MNLI-m.tsv``, ...). With ``config.task.source='tfds'`` the same examples
come from a locally prepared TFDS ``glue/<task>`` dataset instead (``glue_tfds``).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from bertjax import atomic
from bertjax.finetune import glue_tfds
from bertjax.finetune import metrics as M
from bertjax.finetune.tasks import (
    Features,
    FinetuneInputError,
    Task,
    count,
    label_index,
    pack,
    read_tsv,
    stack,
    truncate_pair,
)

_NLI3 = ("contradiction", "entailment", "neutral")
_NLI2 = ("entailment", "not_entailment")
_BINARY = ("0", "1")


@dataclasses.dataclass(frozen=True)
class Spec:
    """Where a GLUE task's fields live. Column indices may be negative (from the end)."""

    submission: str  # submission file stem, e.g. "MRPC"
    labels: tuple[str, ...] | None  # None: regression (STS-B)
    metrics: tuple[str, ...]  # the first is the primary (sweep-selection) metric
    text_a: int
    text_b: int | None
    label: int
    test_text_a: int
    test_text_b: int | None
    train_header: bool = True
    dev: tuple[str, ...] = ("dev",)
    test: tuple[str, ...] = ("test",)
    skip_short_rows: bool = False  # QQP: the reference processors skip rows missing columns


TASKS = {
    "cola": Spec("CoLA", _BINARY, ("mcc", "accuracy"), 3, None, 1, 1, None, train_header=False),
    "sst2": Spec("SST-2", _BINARY, ("accuracy",), 0, None, 1, 1, None),
    "mrpc": Spec("MRPC", _BINARY, ("f1", "accuracy"), 3, 4, 0, 3, 4),
    "stsb": Spec("STS-B", None, ("spearman", "pearson"), 7, 8, -1, 7, 8),
    "qqp": Spec("QQP", _BINARY, ("f1", "accuracy"), 3, 4, 5, 1, 2, skip_short_rows=True),
    "mnli": Spec(
        "MNLI",
        _NLI3,
        ("accuracy",),
        8,
        9,
        -1,
        8,
        9,
        dev=("dev_matched", "dev_mismatched"),
        test=("test_matched", "test_mismatched"),
    ),
    "qnli": Spec("QNLI", _NLI2, ("accuracy",), 1, 2, -1, 1, 2),
    "rte": Spec("RTE", _NLI2, ("accuracy",), 1, 2, -1, 1, 2),
    "wnli": Spec("WNLI", _BINARY, ("accuracy",), 1, 2, -1, 1, 2),
}
_SUBMISSION_SUFFIX = {"test_matched": "-m", "test_mismatched": "-mm"}


@dataclasses.dataclass
class Example:
    guid: str
    text_a: str
    text_b: str | None
    label: str | float | None  # None on test sets
    where: str  # "file:line", for error messages


class GlueTask(Task):
    """One GLUE task (see ``tasks`` for the protocol), from the TSV files or, after
    ``use_tfds``, from a prepared TFDS ``glue/<task>`` dataset (``glue_tfds``)."""

    train_split = "train"

    def __init__(self, name: str):
        self.name = name
        self.spec = TASKS[name]
        self.head = "regression" if self.spec.labels is None else "classification"
        self.num_labels = 1 if self.spec.labels is None else len(self.spec.labels)
        self.label_list = self.spec.labels
        self.dev_splits = self.spec.dev
        self.test_splits = self.spec.test
        self.primary_metric = self.spec.metrics[0]
        self.skipped: dict[str, int] = {}
        self.tfds_data_dir: str | None = None

    def use_tfds(self, tfds_data_dir: str) -> None:
        self.tfds_data_dir = tfds_data_dir

    def split_path(self, data_dir: str, split: str) -> str:
        if self.tfds_data_dir is not None:
            return glue_tfds.describe(self.name, split, self.tfds_data_dir)
        return os.path.join(data_dir, f"{split}.tsv")

    def has_split(self, data_dir: str, split: str) -> bool:
        if self.tfds_data_dir is not None:
            return glue_tfds.has_split(self.name, split, self.tfds_data_dir)
        return super().has_split(data_dir, split)

    def read(self, data_dir: str, split: str) -> list[Example]:
        if self.tfds_data_dir is not None:
            where = glue_tfds.describe(self.name, split, self.tfds_data_dir)
            rows = glue_tfds.read(self.name, split, self.tfds_data_dir, self.spec.labels or ())
            return [Example(g, a, b, label, f"{where} {g}") for g, a, b, label in rows]
        path = self.split_path(data_dir, split)
        is_test = split.startswith("test")
        header, rows = read_tsv(path, has_header=is_test or self.spec.train_header)
        width = len(header) if header is not None else 4  # CoLA train/dev: 4 columns, no header
        if width < self._columns_needed(is_test):
            raise FinetuneInputError(
                f"{path}: the header has {width} tab-separated columns, a {self.name} "
                f"{'test' if is_test else 'train/dev'} file has at least "
                f"{self._columns_needed(is_test)}"
            )
        examples = []
        for line, row in rows:
            where = f"{path}:{line}"
            if len(row) != width:
                if self.spec.skip_short_rows:
                    count(self.skipped, f"{split}: rows with a wrong column count")
                    continue
                raise FinetuneInputError(
                    f"{where}: expected {width} tab-separated columns "
                    f"{'like the header' if header else ''}, got {len(row)}"
                )
            examples.append(self._example(row, where, f"{split}-{line}", is_test))
        return examples

    def _columns_needed(self, is_test: bool) -> int:
        """How many columns the spec's indices reach (a negative index counts from the end)."""
        spec = self.spec
        used = (
            (0, spec.test_text_a, spec.test_text_b)
            if is_test
            else (spec.text_a, spec.text_b, spec.label)
        )
        return max(i + 1 if i >= 0 else -i for i in used if i is not None)

    def _example(self, row: list[str], where: str, guid: str, is_test: bool) -> Example:
        spec = self.spec
        if is_test:
            text_b = row[spec.test_text_b] if spec.test_text_b is not None else None
            return Example(row[0], row[spec.test_text_a], text_b, None, where)
        text_b = row[spec.text_b] if spec.text_b is not None else None
        label: str | float = row[spec.label]
        if spec.labels is None:
            try:
                label = float(label)
            except ValueError:
                raise FinetuneInputError(f"{where}: score {label!r} is not a number") from None
        else:
            label_index(spec.labels, label, where)
        return Example(guid, row[spec.text_a], text_b, label, where)

    def featurize(self, examples: list[Example], tokenizer, config) -> Features:
        max_len = config.data.max_seq_length
        tokens_a = tokenizer.encode([e.text_a for e in examples])
        paired = self.spec.text_b is not None
        tokens_b = (
            tokenizer.encode([e.text_b for e in examples]) if paired else [None] * len(examples)
        )
        rows = []
        for example, a, b in zip(examples, tokens_a, tokens_b, strict=True):
            if b is None:
                a = a[: max_len - 2]
            else:
                truncate_pair(a, b, max_len - 3)
            input_ids, segment_ids, input_mask = pack(tokenizer, a, b, max_len)
            rows.append(
                dict(
                    input_ids=input_ids,
                    segment_ids=segment_ids,
                    input_mask=input_mask,
                    label_ids=self._label_value(example),
                )
            )
        keys = ("input_ids", "segment_ids", "input_mask", "label_ids")
        arrays = stack(rows, keys) if rows else {k: np.zeros((0, max_len), np.int32) for k in keys}
        return Features(arrays, meta=list(range(len(examples))), skipped=dict(self.skipped))

    def _label_value(self, example: Example):
        if self.spec.labels is None:
            return np.float32(example.label if example.label is not None else 0.0)
        if example.label is None:
            return np.int32(0)
        return np.int32(self.spec.labels.index(example.label))

    def predictions(self, logits: np.ndarray) -> np.ndarray:
        """<float32>[N, C] -> <int32>[N] class ids, or <float32>[N] scores for regression."""
        return logits[:, 0] if self.spec.labels is None else np.argmax(logits, axis=-1)

    def evaluate(self, examples, features, logits: np.ndarray):
        predicted = self.predictions(logits)
        gold = features.arrays["label_ids"]
        out = {}
        for name in self.spec.metrics:
            fn = {
                "accuracy": M.accuracy,
                "f1": M.f1_positive,
                "mcc": M.matthews_corrcoef,
                "pearson": M.pearson,
                "spearman": M.spearman,
            }[name]
            out[name] = 100.0 * fn(gold, predicted)
        out["num_examples"] = len(examples)
        return out, predicted

    def _label_text(self, value, exact: bool = False) -> str:
        if self.spec.labels is None:
            return repr(float(value)) if exact else f"{float(value):.3f}"
        return self.spec.labels[int(value)]

    def write_predictions(self, out_dir, split, examples, features, logits, with_labels=True):
        """Dev: ``{split}_predictions.tsv`` with gold labels; test: the GLUE submission file."""
        predicted = self.predictions(logits)
        if split.startswith("test"):
            name = f"{self.spec.submission}{_SUBMISSION_SUFFIX.get(split, '')}.tsv"
            lines = ["index\tprediction"] + [
                f"{e.guid}\t{self._label_text(p)}" for e, p in zip(examples, predicted, strict=True)
            ]
        else:
            name = f"{split}_predictions.tsv"
            # Dev scores in full, so the correlations can be recomputed from the file.
            lines = ["index\tprediction\tlabel"] + [
                f"{e.guid}\t{self._label_text(p, exact=True)}\t"
                + (str(e.label) if e.label is not None else "")
                for e, p in zip(examples, predicted, strict=True)
            ]
        path = os.path.join(out_dir, name)
        atomic.write_text(path, "\n".join(lines) + "\n")
        return [path]
