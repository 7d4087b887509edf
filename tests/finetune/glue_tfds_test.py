"""GLUE from TFDS ``glue/*``: feature names and labels as tensorflow_datasets/text/glue.py defines
them (the installed builder is the reference), and a ``glue/mrpc`` prepared from the TSV fixture
by the real builder, then read by name. Nothing is downloaded: the builder's download step is
pointed at local files built from the fixture.
"""

import csv

import ml_collections
import pytest

from bertjax.finetune import glue, glue_tfds, inputs, tasks
from bertjax.finetune.tasks import FinetuneInputError
from tests.finetune.glue_test import LAYOUTS

tfds = pytest.importorskip("tensorflow_datasets")
from tensorflow_datasets.text import glue as tfds_glue  # noqa: E402


def test_feature_names_and_classes_are_the_tfds_builders():
    assert sorted(glue_tfds.FEATURES) == sorted(glue.TASKS)
    for name, (feature_a, feature_b, classes) in glue_tfds.FEATURES.items():
        reference = tfds_glue.Glue.builder_configs[name]
        assert tuple(reference.text_features) == tuple(f for f in (feature_a, feature_b) if f)
        assert reference.label_classes == (None if classes is None else list(classes))


@pytest.mark.parametrize("name", sorted(set(LAYOUTS) - {"mrpc"}))
def test_labels_map_back_to_the_tsv_readers(tmp_path, name):
    """The TFDS builder's own example generator on a GLUE TSV, encoded as TFDS stores it, read
    back through glue_tfds == the TSV reader on the same file (text, text, label)."""
    header, row, label, test_header, test_row = LAYOUTS[name]
    split_file = {"mnli": "dev_matched"}.get(name, "dev")
    for split, head, line in ((split_file, header, row), ("test", test_header, test_row)):
        path = tmp_path / f"{split}.tsv"
        if split == "test":  # TFDS numbers test rows 0.. like the GLUE test files' index column
            line = "0" + line[1:]
        path.write_text((f"{head}\n" if head else "") + f"{line}\n")
        builder = tfds_glue.Glue(config=name, data_dir=str(tmp_path / "tfds"))
        tfds_split = "test" if split == "test" else "dev"
        (_, record), *_ = builder._generate_examples(data_file=str(path), split=tfds_split)
        stored = builder.info.features.encode_example(record)
        task = glue.GlueTask(name)
        tsv = task.read(str(tmp_path), split)[0]
        converted = glue_tfds.convert(name, split, stored, task.spec.labels or (), "x")
        assert converted[2:] == (tsv.text_a, tsv.text_b, tsv.label)
        if split == "test":
            assert converted[1] == tsv.guid == "0"
        else:
            assert tsv.label == label


def _msr_sources(fixture, out):
    """The original MSR files that the TFDS builder prepares glue/mrpc from: one train file
    (with a UTF-8 BOM) holding the GLUE train and dev rows, the dev id pairs, the test file."""

    def rows(split):
        with open(fixture / f"{split}.tsv", encoding="utf-8") as f:
            return list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))

    train, dev = rows("train"), rows("dev")
    body = [[r[0], str(1000 + i), str(5000 + i), *r[3:]] for i, r in enumerate(train[1:] + dev[1:])]
    dev_ids = [r[1:3] for r in body[len(train) - 1 :]]
    (out / "msr_train.txt").write_text(
        "\ufeff" + "\n".join("\t".join(r) for r in [train[0], *body]) + "\n", encoding="utf-8"
    )
    (out / "dev_ids.txt").write_text("\n".join("\t".join(r) for r in dev_ids) + "\n")
    return {
        "train": str(out / "msr_train.txt"),
        "dev_ids": str(out / "dev_ids.txt"),
        "test": str(fixture / "test.tsv"),
    }


def test_mrpc_prepared_from_the_fixture_then_read_by_name(testdata, tmp_path, monkeypatch):
    fixture = testdata / "finetune/mrpc"
    sources = _msr_sources(fixture, tmp_path)
    monkeypatch.setattr(
        tfds.download.DownloadManager, "download", lambda self, urls: {k: sources[k] for k in urls}
    )
    data_dir = str(tmp_path / "tfds")
    tfds.builder("glue/mrpc", data_dir=data_dir).download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False)
    )
    monkeypatch.undo()
    config = ml_collections.ConfigDict(
        {"task": dict(name="mrpc", source="tfds", tfds_data_dir=data_dir, data_dir="")}
    )
    from_tfds = tasks.get_task(config)
    from_tsv = glue.GlueTask("mrpc")
    for split in ("train", "dev", "test"):
        assert from_tfds.has_split("", split)
        got = [(e.text_a, e.text_b, e.label) for e in from_tfds.read("", split)]
        want = [(e.text_a, e.text_b, e.label) for e in from_tsv.read(str(fixture), split)]
        assert got == want  # same rows, same order (sorted by idx), labels as the TSV's
    assert [e.guid for e in from_tfds.read("", "test")] == ["0", "1", "2", "3"]
    assert inputs.existing_splits(from_tfds, config, ("test", "dev_matched")) == ["test"]


def test_tfds_errors(tmp_path):
    config = ml_collections.ConfigDict(
        {"task": dict(name="rte", source="tfds", tfds_data_dir=str(tmp_path))}
    )
    with pytest.raises(FinetuneInputError, match=r"glue/rte is not prepared there"):
        tasks.get_task(config).read("", "train")
    config.task.name = "squad_v1"
    with pytest.raises(FinetuneInputError, match=r"only the GLUE tasks have TFDS builders"):
        tasks.get_task(config)
    config.task.source = "hub"
    with pytest.raises(FinetuneInputError, match=r"config.task.source='hub': expected one of"):
        tasks.get_task(config)
