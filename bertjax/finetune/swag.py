"""SWAG (paper §4.4): the standard CSVs, 4 choices ``[CLS] sent1 [SEP] sent2 ending [SEP]``.

Files in ``config.task.data_dir``: ``train.csv``, ``val.csv``, ``test.csv`` as released by the SWAG
authors (header ``video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0..ending3,label``;
``test.csv`` has no ``label``). Sentence A is ``sent1``, sentence B the start of the second
sentence (``sent2``) followed by one ending; a vector V scores each choice's pooled output and a
softmax runs over the 4 choices (``heads.BertForMultipleChoice``). Metric: accuracy.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os

import numpy as np

from bertjax import atomic
from bertjax.finetune import metrics as M
from bertjax.finetune.tasks import (
    Features,
    FinetuneInputError,
    Task,
    pack,
    read_text,
    truncate_pair,
)

TASKS = {"swag": 4}
NUM_CHOICES = 4
_FILES = {"train": "train.csv", "dev": "val.csv", "test": "test.csv"}
_COLUMNS = ("sent1", "sent2", "ending0", "ending1", "ending2", "ending3")


@dataclasses.dataclass
class SwagExample:
    guid: str
    context: str
    start_ending: str
    endings: list[str]
    label: int | None


class SwagTask(Task):
    head = "choice"
    num_labels = NUM_CHOICES
    train_split, dev_splits, test_splits = "train", ("dev",), ("test",)
    primary_metric = "accuracy"

    def __init__(self, name: str):
        self.name = name
        self.skipped: dict[str, int] = {}

    def split_path(self, data_dir: str, split: str) -> str:
        return os.path.join(data_dir, _FILES[split])

    def read(self, data_dir: str, split: str) -> list[SwagExample]:
        path = self.split_path(data_dir, split)
        with io.StringIO(read_text(path), newline="") as f:  # as open(newline=""), for csv
            reader = csv.DictReader(f)
            needed = _COLUMNS + (("label",) if split != "test" else ())
            missing = [c for c in needed if c not in (reader.fieldnames or [])]
            if missing:
                raise FinetuneInputError(f"{path}:1: header lacks the SWAG columns {missing}")
            examples = []
            for row in reader:
                where = f"{path}:{reader.line_num}"
                if None in row or any(row[c] is None for c in needed):
                    raise FinetuneInputError(
                        f"{where}: expected {len(reader.fieldnames)} "
                        f"comma-separated columns like the header"
                    )
                label = None
                if split != "test":
                    if row["label"] not in ("0", "1", "2", "3"):
                        raise FinetuneInputError(
                            f"{where}: label {row['label']!r} is not in the "
                            f"label set ['0', '1', '2', '3']"
                        )
                    label = int(row["label"])
                guid = row.get("fold-ind") or str(len(examples))
                examples.append(
                    SwagExample(
                        guid,
                        row["sent1"],
                        row["sent2"],
                        [row[f"ending{i}"] for i in range(4)],
                        label,
                    )
                )
        return examples

    def featurize(self, examples: list[SwagExample], tokenizer, config) -> Features:
        contexts = tokenizer.encode([e.context for e in examples])
        endings = tokenizer.encode(
            [f"{e.start_ending} {end}" for e in examples for end in e.endings]
        )
        arrays = {k: [] for k in ("input_ids", "segment_ids", "input_mask")}
        for i, context in enumerate(contexts):
            choices = []
            for j in range(NUM_CHOICES):
                a, b = list(context), list(endings[i * NUM_CHOICES + j])
                truncate_pair(a, b, config.data.max_seq_length - 3)
                choices.append(pack(tokenizer, a, b, config.data.max_seq_length))
            for k, key in enumerate(arrays):
                arrays[key].append(np.stack([c[k] for c in choices]))
        if not examples:
            raise FinetuneInputError("SWAG: no examples (empty input file?)")
        out = {k: np.stack(v) for k, v in arrays.items()}
        out["label_ids"] = np.asarray([e.label or 0 for e in examples], np.int32)
        return Features(out, list(range(len(examples))), dict(self.skipped))

    def evaluate(self, examples, features, logits):
        predicted = np.argmax(logits, axis=-1)
        gold = [e.label for e in examples]
        return {
            "accuracy": 100.0 * M.accuracy(gold, predicted),
            "num_examples": len(examples),
        }, predicted

    def write_predictions(self, out_dir, split, examples, features, logits, with_labels=True):
        predicted = np.argmax(logits, axis=-1)
        lines = ["id,prediction,label"] + [
            f"{e.guid},{p},{'' if e.label is None else e.label}"
            for e, p in zip(examples, predicted, strict=True)
        ]
        path = os.path.join(out_dir, f"{split}_predictions.csv")
        atomic.write_text(path, "\n".join(lines) + "\n")
        return [path]
