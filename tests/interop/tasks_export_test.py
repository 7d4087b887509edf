"""Fine-tuned checkpoints, as fine-tuning writes them (``finetune.loop.save``), exported to HF's
task classes: transformers loads each with no missing or unexpected keys, its config carries the
task's labels and problem type, and it gives the same logits as bertjax on the same inputs
(fp32). Reading the export back gives the checkpoint bit for bit.

Every parameter is perturbed with seeded noise, so no bias is zero and no LayerNorm scale is
one: a weight mapped to the wrong place, or transposed, changes the logits.
"""

import jax
import ml_collections
import numpy as np
import pytest
import torch
import transformers

from bertjax.finetune import inputs, loop, ner, objective, tasks
from bertjax.interop import formats, hf
from bertjax.interop.converted import ConvertError
from bertjax.model.config import BertConfig
from bertjax.training import checkpoint
from tests.interop.references import MINILM, batch, leaves, loaded_cleanly, torch_inputs

CONFIG = BertConfig(vocab_size=30522, hidden_size=32, num_layers=2, num_heads=4,
                    intermediate_size=64, max_position_embeddings=64)  # fmt: skip
LOGITS_TOL = 1e-5
# config.task.name -> (HF class, its config's problem_type and id2label)
CASES = {
    "mrpc": ("BertForSequenceClassification", "single_label_classification", {0: "0", 1: "1"}),
    "stsb": ("BertForSequenceClassification", "regression", {0: "LABEL_0"}),
    "conll2003": ("BertForTokenClassification", None, dict(enumerate(ner.CONLL2003_LABELS))),
    "squad_v1": ("BertForQuestionAnswering", None, {0: "LABEL_0", 1: "LABEL_1"}),
    "swag": ("BertForMultipleChoice", None, {0: "LABEL_0", 1: "LABEL_1"}),
}


def get_task(name: str):
    return tasks.get_task(ml_collections.ConfigDict(
        {"task": {"name": name, "source": "files", "tfds_data_dir": ""}}))  # fmt: skip


def model_inputs(task) -> dict[str, np.ndarray]:
    """Two examples with padding and two segments; multiple choice: 4 choices each."""
    choices = 4 if task.head == "choice" else 1
    ids, segments, mask = batch(7, batch=2 * choices, length=16)
    shape = (2, choices, 16) if task.head == "choice" else (2, 16)
    return {k: v.reshape(shape) for k, v in
            zip(objective.MODEL_INPUTS, (ids, segments, mask), strict=True)}  # fmt: skip


def fine_tuned(task, directory) -> tuple[dict, str]:
    """(params, the checkpoint path) of a random fine-tuned model written by the loop's save."""
    model = objective.build_model(task, CONFIG)
    params = inputs.init_params(model, {}, model_inputs(task), jax.random.key(0))
    rng = np.random.default_rng(1)
    noisy = lambda x: (np.asarray(x) + rng.normal(0, 0.2, np.shape(x))).astype(np.float32)
    params = jax.tree.map(noisy, params)
    return params, loop.save(str(directory), params, CONFIG, str(MINILM / "vocab.txt"), True, task)


def hf_logits(model, task, features) -> np.ndarray:
    """transformers' logits in bertjax's layout (QA: start and end stacked last)."""
    with torch.no_grad():
        out = model(**torch_inputs(*(features[k] for k in objective.MODEL_INPUTS)))
    if task.head == "span":
        return np.stack([out.start_logits.numpy(), out.end_logits.numpy()], axis=-1)
    return out.logits.numpy()


@pytest.mark.parametrize("name", list(CASES))
def test_fine_tuned_checkpoint_exports_to_its_hf_class(name, tmp_path):
    hf_class, problem_type, id2label = CASES[name]
    task = get_task(name)
    params, path = fine_tuned(task, tmp_path / "run")
    formats.convert(path, str(tmp_path / "hf"), "hf")
    reference = loaded_cleanly(getattr(transformers, hf_class), tmp_path / "hf")
    assert reference.config.problem_type == problem_type
    assert reference.config.id2label == id2label and reference.config.finetuning_task == name

    features = model_inputs(task)
    model = objective.build_model(task, CONFIG)
    arrays = [features[k] for k in objective.MODEL_INPUTS]
    ours = np.asarray(jax.jit(model.apply)({"params": params}, *arrays))
    theirs = hf_logits(reference, task, features)
    assert ours.shape == theirs.shape and np.abs(theirs).max() > 0.1
    diff = float(np.abs(ours - theirs).max())
    print(f"\n{name} -> {hf_class}: logits max abs diff {diff:.3g}")
    assert diff <= LOGITS_TOL

    formats.convert(str(tmp_path / "hf"), str(tmp_path / "back"), "bertjax")
    original, _, meta = checkpoint.load_params(path)
    back, _, meta_back = checkpoint.load_params(tmp_path / "back")
    assert meta_back["task"] == meta["task"] == task.record()
    pairs = zip(leaves(original), leaves(back), strict=True)
    for (name_a, a), (name_b, b) in pairs:
        assert name_a == name_b and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b, err_msg=name_a)


def test_every_fine_tuning_head_has_an_hf_class():
    assert sorted(hf.TASK_ARCHITECTURES) == sorted(tasks.HEADS)
    assert sorted({get_task(name).head for name in CASES}) == sorted(tasks.HEADS)


@pytest.mark.parametrize("task_record,expected", [
    (None, r"heads \['classifier', 'pooler'\]: HF export needs pooler\+mlm\+nsp "
           r"\(BertForPreTraining\), at most a pooler \(BertModel\), or a fine-tuned "
           r"checkpoint's task record"),
    ({"name": "mnli", "head": "classification", "labels": ["a", "b", "c"]},
     r"task head 'classification' with labels \['a', 'b', 'c'\]: the classifier has 2 "
     r"outputs, expected 3"),
    ({"name": "x", "head": "tagging", "labels": ["O", "B"]},
     r"task head 'tagging' \(BertForTokenClassification\) needs params \['classifier'\] "
     r"besides the encoder, found \['classifier', 'pooler'\]"),
])  # fmt: skip
def test_task_record_that_does_not_fit_is_one_line(tmp_path, task_record, expected):
    params, path = fine_tuned(get_task("mrpc"), tmp_path / "run")
    checkpoint.save_params(tmp_path / "edited", params, CONFIG, str(MINILM / "vocab.txt"), True,
                           task=task_record)  # fmt: skip
    with pytest.raises(ConvertError, match=expected):
        formats.convert(str(tmp_path / "edited"), str(tmp_path / "hf"), "hf")
    assert not (tmp_path / "hf").exists()
