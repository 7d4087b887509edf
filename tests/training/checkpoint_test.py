"""Params-only checkpoints: written atomically and sealed, verified on read (a changed vocab.txt
or weight file is named), vocab fingerprints compared by size and content."""

import json

import numpy as np
import pytest

from bertjax.data import bundled
from bertjax.model.config import BertConfig
from bertjax.training import checkpoint, checkpoint_manifest

CONFIG = BertConfig(vocab_size=7633, hidden_size=8, num_layers=1, num_heads=2,
                    intermediate_size=16)  # fmt: skip


def _params():
    rng = np.random.default_rng(0)
    encoder = {"w": rng.normal(size=(4, 8)).astype(np.float32), "layers": {"layer_0": {"b": 1.0}}}
    return {"encoder": encoder, "nsp": {"b": np.ones(2)}}


def test_round_trip_is_sealed_and_records_the_vocab(tmp_path):
    path = checkpoint.save_params(tmp_path / "ckpt", _params(), CONFIG, bundled.VOCAB, True)
    meta = json.loads((path / checkpoint.META_FILE).read_text())
    assert meta["vocab"] == checkpoint.vocab_fingerprint(bundled.VOCAB)
    assert meta["vocab"]["entries"] == 7633 and meta["heads"] == ["nsp"]
    checkpoint_manifest.verify(path)
    params, bert_config, _ = checkpoint.load_params(path)
    np.testing.assert_array_equal(params["encoder"]["w"], _params()["encoder"]["w"])
    assert bert_config == CONFIG
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary directory left


def test_a_changed_file_fails_verification_naming_it(tmp_path):
    path = checkpoint.save_params(tmp_path / "ckpt", _params(), CONFIG, bundled.VOCAB, True)
    vocab = path / checkpoint.VOCAB_FILE
    lines = vocab.read_text().splitlines()
    vocab.write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n")  # same size, swapped
    with pytest.raises(checkpoint_manifest.CheckpointCorrupt, match="vocab.txt: checksum differs"):
        checkpoint.load_params(path)


def test_vocab_comparison_names_both_files_and_what_differs(tmp_path):
    recorded = checkpoint.vocab_fingerprint(bundled.VOCAB)
    lines = open(bundled.VOCAB).read().splitlines()
    other = tmp_path / "other.txt"
    other.write_text("\n".join(lines[:1000]) + "\n")
    with pytest.raises(checkpoint.CheckpointError) as error:
        checkpoint.compare_vocab(recorded, "CKPT/vocab.txt", str(other), "config.data.vocab_file")
    assert str(error.value).startswith(f"config.data.vocab_file={other} has 1000 entries but ")
    assert "CKPT/vocab.txt" in str(error.value) and "sizes differ" in str(error.value)
    checkpoint.compare_vocab(recorded, "CKPT/vocab.txt", bundled.VOCAB, "x")  # the same: fine


@pytest.mark.parametrize("task,error", [
    ({"name": "mrpc", "head": "classification", "labels": ["0", "1"]}, None),
    ({"name": None, "head": "span", "labels": None}, None),
    ({"name": "mrpc", "head": "classification", "labels": [0, 1]}, "task="),
    ({"name": "mrpc", "head": "classification"}, "task="),
    ("mrpc", "task="),
])  # fmt: skip
def test_task_record_is_kept_or_rejected_in_one_line(tmp_path, task, error):
    """A fine-tuned checkpoint's task record (what HF export reads) round-trips; a malformed one
    is one line naming the metadata file when read."""
    path = checkpoint.save_params(tmp_path / "ckpt", _params(), CONFIG, bundled.VOCAB, True,
                                  task=task)  # fmt: skip
    if error is None:
        assert checkpoint.load_params(path)[2]["task"] == task
        return
    with pytest.raises(checkpoint.CheckpointError, match=f"{checkpoint.META_FILE}: {error}"):
        checkpoint.load_params(path)
