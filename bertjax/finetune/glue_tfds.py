"""GLUE read from a locally prepared TFDS ``glue/<task>`` dataset (``config.task.source='tfds'``).

bertjax never downloads: prepare the dataset first (``tfds build glue/mrpc --data_dir=DIR``, or
copy a prepared ``DIR/glue/<task>/<version>``) and pass ``config.task.tfds_data_dir=DIR``. Feature
names and label conventions are those of ``tensorflow_datasets/text/glue.py``:

* text features per task in ``FEATURES`` (e.g. MNLI ``premise``/``hypothesis``, QNLI
  ``question``/``sentence``), plus ``idx`` (row number in the source file) and ``label``;
* ``label`` is a ClassLabel whose index the builder takes from the TSV label: the class of that
  name when the label is one of the class names (MNLI, QNLI, RTE), else ``int(label)`` (the 0/1
  tasks, whose class names are e.g. ``unacceptable``/``acceptable``). ``tsv_label`` inverts
  this back to the label strings the TSV reader uses (``glue.TASKS[task].labels``); note MNLI's
  TFDS order (entailment, neutral, contradiction) differs from run_classifier.py's;
* STS-B's label is a float32 score; every test split has label -1 (no label);
* splits ``train``, ``validation``, ``test`` (MNLI: ``validation_matched``,
  ``validation_mismatched``, ``test_matched``, ``test_mismatched``).

Examples come back sorted by ``idx`` (TFDS shuffles records when it prepares a dataset); test
examples use ``idx`` as the submission index, like the ``index`` column of the GLUE test TSVs.
"""

from __future__ import annotations

import numpy as np

from bertjax.finetune.tasks import FinetuneInputError

# task -> (text feature of segment A, of segment B or None, TFDS class names or None = score)
FEATURES = {
    "cola": ("sentence", None, ("unacceptable", "acceptable")),
    "sst2": ("sentence", None, ("negative", "positive")),
    "mrpc": ("sentence1", "sentence2", ("not_equivalent", "equivalent")),
    "qqp": ("question1", "question2", ("not_duplicate", "duplicate")),
    "stsb": ("sentence1", "sentence2", None),
    "mnli": ("premise", "hypothesis", ("entailment", "neutral", "contradiction")),
    "qnli": ("question", "sentence", ("entailment", "not_entailment")),
    "rte": ("sentence1", "sentence2", ("entailment", "not_entailment")),
    "wnli": ("sentence1", "sentence2", ("not_entailment", "entailment")),
}
# bertjax split name -> TFDS split name
SPLITS = {
    "train": "train",
    "dev": "validation",
    "test": "test",
    "dev_matched": "validation_matched",
    "dev_mismatched": "validation_mismatched",
    "test_matched": "test_matched",
    "test_mismatched": "test_mismatched",
}


def tsv_label(task: str, index: int, tsv_labels) -> str:
    """TFDS class ``index`` -> the GLUE TSV label it was built from (the builder's rule undone:
    a class name that is a TSV label stays; otherwise the TSV label was ``str(index)``)."""
    name = FEATURES[task][2][index]
    return name if name in tsv_labels else str(index)


def describe(task: str, split: str, data_dir: str) -> str:
    return f"tfds glue/{task}:{SPLITS[split]} in {data_dir or 'the default TFDS data_dir'}"


def _builder(task: str, data_dir: str):
    import tensorflow_datasets as tfds  # TensorFlow import: only for this source

    builder = tfds.builder(f"glue/{task}", data_dir=data_dir or None)
    if not builder.is_prepared():
        raise FinetuneInputError(
            f"config.task.tfds_data_dir={data_dir!r}: glue/{task} is not prepared there (expected "
            f"{builder.data_dir}); run `tfds build glue/{task} --data_dir=DIR` where GLUE can "
            f"be downloaded (bertjax never downloads)"
        )
    return builder


def has_split(task: str, split: str, data_dir: str) -> bool:
    return SPLITS[split] in _builder(task, data_dir).info.splits


def read(task: str, split: str, data_dir: str, tsv_labels) -> list[tuple]:
    """-> ``(guid, text_a, text_b, label)`` rows sorted by ``idx``; label None on test splits,
    a TSV label string for classification, a float for STS-B."""
    import tensorflow_datasets as tfds

    builder = _builder(task, data_dir)
    feature_a, feature_b, classes = FEATURES[task]
    where = describe(task, split, data_dir)
    features = builder.info.features
    names = getattr(features["label"], "names", None) if "label" in features else None
    expected = {feature_a, feature_b, "label", "idx"} - {None}
    if set(features.keys()) != expected or (classes and tuple(names or ()) != classes):
        raise FinetuneInputError(
            f"{where}: features {sorted(features.keys())} (label classes {names}) differ from "
            f"TFDS glue/{task}: {sorted(expected)} (label classes {classes})"
        )
    if SPLITS[split] not in builder.info.splits:
        raise FinetuneInputError(f"{where}: no such split; has {sorted(builder.info.splits)}")
    dataset = builder.as_dataset(split=SPLITS[split], shuffle_files=False)
    rows = [convert(task, split, record, tsv_labels, where) for record in tfds.as_numpy(dataset)]
    return [row[1:] for row in sorted(rows, key=lambda row: row[0])]


def _text(value) -> str:
    value = value.item() if hasattr(value, "item") else value  # numpy scalar / 0-d array
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def convert(task: str, split: str, record: dict, tsv_labels, where: str) -> tuple:
    """One TFDS glue record (as stored: class index, text) -> (idx, guid, text_a, text_b, label)."""
    feature_a, feature_b, classes = FEATURES[task]
    idx, label = int(record["idx"]), record["label"]
    text_b = _text(record[feature_b]) if feature_b else None
    if split.startswith("test"):
        value, guid = None, str(idx)
    elif classes is None:  # float32 score; its shortest decimal is the TSV's ("3.8", not 3.79..)
        value, guid = float(str(np.float32(label))), f"{split}-{idx}"
    elif 0 <= int(label) < len(classes):
        value, guid = tsv_label(task, int(label), tsv_labels), f"{split}-{idx}"
    else:
        raise FinetuneInputError(
            f"{where}: idx {idx} has label {int(label)}, "
            f"expected a class index in 0..{len(classes) - 1}"
        )
    return idx, guid, _text(record[feature_a]), text_b, value
