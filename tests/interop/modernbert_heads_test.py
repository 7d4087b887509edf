"""ModernBERT's four fine-tuning classes against transformers 4.57.6 (eager, float32, CPU):
``ModernBertFor{SequenceClassification,TokenClassification,QuestionAnswering,MultipleChoice}``
with random weights (every norm and bias moved off its init, attention peaked), read into
bertjax's 'modernbert' task models (``bertjax.model.heads``) through ``bertjax.interop``, give
the same logits within 1e-5 relative at the real positions of a padded batch longer than the
local window, with [CLS] and mean pooling and with and without the head's bias. A packed row of
two examples gives each example's logits alone. A fine-tuned checkpoint exports to its class,
which transformers loads with no missing or unexpected keys and the task's labels, and reads
back bit for bit."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bertjax.interop import hf
from bertjax.interop import modernbert as interop
from bertjax.interop.converted import Converted
from bertjax.model import heads
from tests.model import modernbert_test as cases

LENGTH, WINDOW, LABELS = 40, 16, 3  # longer than the window (and than half of it each side)
CLASSES = {  # HF class -> (bertjax fine-tuning head, outputs of bertjax's model per example)
    "ModernBertForSequenceClassification": "classification",
    "ModernBertForTokenClassification": "tagging",
    "ModernBertForQuestionAnswering": "span",
    "ModernBertForMultipleChoice": "choice",
}


def _hf(cls: str, seed=0, **changes):
    labels = 2 if CLASSES[cls] == "span" else LABELS  # HF's QA class splits its 2 outputs
    config = cases._hf_config(local_attention=WINDOW, num_labels=labels, **changes)
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(config).eval()
    with torch.no_grad():  # as modernbert_test's: every norm and bias matters, attention peaked
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.add_(0.3 * torch.randn_like(p))
            if "Wqkv" in name:
                p.mul_(15.0)
    return model


def _bertjax_model(cls: str, cfg):
    head = CLASSES[cls]
    if head == "classification":
        return heads.BertForSequenceClassification(cfg, LABELS)
    if head == "tagging":
        return heads.BertForTokenClassification(cfg, LABELS)
    if head == "span":
        return heads.BertForQuestionAnswering(cfg)
    return heads.BertForMultipleChoice(cfg)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _apply(cls, cfg, params, ids, mask):
    return _bertjax_model(cls, cfg).apply({"params": params}, ids, jnp.zeros_like(ids), mask)


def _inputs(choices: int = 0):
    """Two rows of LENGTH ids, the second padded after 29 tokens; [C, 2, L] for choices."""
    rng = np.random.default_rng(0)
    shape = (2 * max(choices, 1), LENGTH)
    ids = rng.integers(5, 101, size=shape).astype(np.int32)
    ids[:, 0] = 2  # [CLS]
    mask = np.ones_like(ids)
    mask[1::2, 29:] = 0
    ids[mask == 0] = 0
    if choices:
        return ids.reshape(2, choices, LENGTH), mask.reshape(2, choices, LENGTH)
    return ids, mask


def _converted(model):
    cfg = interop.config_from_hf(model.config.to_dict(), "test")
    tensors = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    return cfg, interop.to_params(tensors, cfg, "test")


@pytest.mark.parametrize(
    "cls,changes",
    [
        ("ModernBertForSequenceClassification", {"classifier_pooling": "cls"}),
        (
            "ModernBertForSequenceClassification",
            {"classifier_pooling": "mean", "classifier_bias": True},
        ),  # fmt: skip
        ("ModernBertForTokenClassification", {"classifier_bias": True}),
        ("ModernBertForQuestionAnswering", {}),
        ("ModernBertForMultipleChoice", {"classifier_pooling": "cls"}),
        ("ModernBertForMultipleChoice", {"classifier_pooling": "mean"}),
    ],
)
def test_logits_equal_transformers(cls, changes):
    model = _hf(cls, **changes)
    cfg, params = _converted(model)
    assert set(params) == {"encoder", "head", "classifier"}
    assert cfg.classifier_pooling == model.config.classifier_pooling
    ids, mask = _inputs(choices=4 if CLASSES[cls] == "choice" else 0)
    with torch.no_grad():
        out = model(torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask))
    got = np.asarray(_apply(cls, cfg, params, ids, mask))
    if CLASSES[cls] == "span":
        want = np.stack([out.start_logits.numpy(), out.end_logits.numpy()], axis=-1)
    else:
        want = out.logits.numpy()
    if CLASSES[cls] in ("span", "tagging"):  # per token: the real positions only
        got, want = got[mask == 1], want[mask == 1]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_a_packed_row_gives_each_example_its_logits_alone(pooling):
    cfg, params = _converted(_hf("ModernBertForSequenceClassification",
                                 classifier_pooling=pooling))  # fmt: skip
    ids, mask = _inputs()
    first, second = ids[0, :22], ids[1, :18]
    row = np.zeros((1, LENGTH), np.int32)
    row[0, :22], row[0, 22:40] = first, second
    sequence_ids = np.zeros_like(row)
    sequence_ids[0, :22], sequence_ids[0, 22:40] = 1, 2
    positions = np.concatenate([np.arange(22), np.arange(18)])[None].astype(np.int32)
    cls_positions = np.array([[0, 22]], np.int32)
    model = heads.BertForSequenceClassification(cfg, LABELS)
    packed = model.apply({"params": params}, row, row * 0, sequence_ids, positions=positions,
                         cls_positions=cls_positions)  # fmt: skip
    for k, alone in enumerate((first, second)):
        want = _apply("ModernBertForSequenceClassification", cfg, params, alone[None],
                      np.ones_like(alone)[None])  # fmt: skip
        np.testing.assert_allclose(packed[0, k], want[0], rtol=1e-5, atol=1e-6)


def _vocab(tmp_path) -> str:
    vocab = tmp_path / "vocab.txt"
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(96)]
    vocab.write_text("\n".join(words) + "\n")
    return str(vocab)


@pytest.mark.parametrize(
    "cls,task",
    [
        ("ModernBertForSequenceClassification",
         {"name": "mnli", "head": "classification", "labels": ["a", "b", "c"]}),
        ("ModernBertForTokenClassification",
         {"name": "conll2003", "head": "tagging", "labels": ["O", "B-PER", "I-PER"]}),
        ("ModernBertForQuestionAnswering", {"name": "squad_v1", "head": "span", "labels": None}),
        ("ModernBertForMultipleChoice", {"name": "swag", "head": "choice", "labels": None}),
    ],
)  # fmt: skip
def test_a_fine_tuned_checkpoint_exports_to_its_class_and_reads_back_bit_exactly(
    cls, task, tmp_path
):
    cfg, params = _converted(_hf(cls, seed=1, classifier_pooling="mean"))
    params = jax.tree.map(np.ascontiguousarray, params)  # as a checkpoint restores them
    conv = Converted(params, cfg, _vocab(tmp_path), True, task)
    dst = hf.write(str(tmp_path / "hf"), conv)
    model, info = getattr(transformers, cls).from_pretrained(
        dst, output_loading_info=True, attn_implementation="eager"
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert model.config.classifier_pooling == "mean"
    if task["labels"]:
        assert [model.config.id2label[i] for i in range(LABELS)] == task["labels"]
    back = hf.read(dst)
    assert back.config == cfg and back.task == task
    for a, b in zip(jax.tree.leaves(back.params), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, b)
    assert jax.tree.structure(back.params) == jax.tree.structure(params)
