"""Google's original TF1 checkpoints read, against HF PyTorch outputs of the same weights.

The TF1 checkpoint is written from a HF model under the original variable names and layout
(google-research/bert ``modeling.py``), with the optimizer slots the original saves beside them.
"""

import json
import pathlib
import shutil

import numpy as np
import pytest

from bertjax.interop import formats
from bertjax.interop.converted import ConvertError
from tests.interop.hf_test import pretraining_diffs
from tests.interop.references import MINILM, TOL


def write_tf1_checkpoint(hf_model, directory: pathlib.Path, **extra) -> None:
    """Writes the HF weights under Google's original names, transposed the original way."""
    import tensorflow as tf

    hf_cfg = hf_model.config
    tensors = dict(extra)
    state = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    for name, value in state.items():
        tensors.update(_tf1_named(name, value))
    # Optimizer slots and the step counter sit next to the weights in Google's checkpoints.
    tensors["bert/pooler/dense/kernel/adam_m"] = np.zeros_like(tensors["bert/pooler/dense/kernel"])
    tensors["bert/pooler/dense/kernel/adam_v"] = np.ones_like(tensors["bert/pooler/dense/kernel"])
    tensors["global_step"] = np.array(1000, np.int64)
    names = sorted(tensors)
    values = [tensors[n] for n in names]
    prefix = str(directory / "bert_model.ckpt")
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=values)  # fmt: skip
    original = {"vocab_size": hf_cfg.vocab_size, "hidden_size": hf_cfg.hidden_size,
                "num_hidden_layers": hf_cfg.num_hidden_layers, "hidden_act": "gelu",
                "num_attention_heads": hf_cfg.num_attention_heads,
                "intermediate_size": hf_cfg.intermediate_size, "hidden_dropout_prob": 0.1,
                "attention_probs_dropout_prob": 0.1, "type_vocab_size": 2,
                "max_position_embeddings": hf_cfg.max_position_embeddings,
                "initializer_range": 0.02}  # fmt: skip
    (directory / "bert_config.json").write_text(json.dumps(original))
    shutil.copyfile(MINILM / "vocab.txt", directory / "vocab.txt")


def _tf1_named(name: str, value: np.ndarray) -> dict[str, np.ndarray]:
    """One HF tensor -> its original TF1 name and layout (google-research/bert modeling.py)."""
    if name in ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias") or \
            name.endswith("position_ids"):  # fmt: skip
        return {}
    if name == "cls.predictions.bias":
        return {"cls/predictions/output_bias": value}
    if name.startswith("cls.seq_relationship."):  # stored [2, H] in the original, like HF
        return {"cls/seq_relationship/output_" + ("weights" if name.endswith("weight") else "bias"):
                value}  # fmt: skip
    tf_name = name.replace(".", "/").replace("layer/", "layer_")
    if tf_name.endswith("LayerNorm/weight"):
        return {tf_name[: -len("weight")] + "gamma": value}
    if tf_name.endswith("LayerNorm/bias"):
        return {tf_name[: -len("bias")] + "beta": value}
    if "embeddings" in tf_name and tf_name.endswith("/weight"):
        return {tf_name[: -len("/weight")]: value}
    if tf_name.endswith("/weight"):
        return {tf_name[: -len("weight")] + "kernel": value.T}  # dense kernels are [in, out]
    return {tf_name: value}


def test_tf1_import_parity_with_hf(base_pretraining, tmp_path):
    model, _ = base_pretraining
    write_tf1_checkpoint(model, tmp_path)
    assert formats.detect_format(str(tmp_path)) == "tf1"
    conv = formats.load(str(tmp_path), do_lower_case=True)
    assert conv.config.hidden_act == "gelu_tanh"  # the original "gelu" is the tanh form
    mlm, nsp = pretraining_diffs(conv, model)
    print(f"\nTF1 import parity (base): MLM logits max abs diff {mlm:.3g}, NSP {nsp:.3g}")
    assert mlm <= TOL and nsp <= TOL
    with pytest.raises(ConvertError, match="--do_lower_case"):
        formats.load(str(tmp_path))


def test_tf1_prefix_source_and_unknown_names(small_pretraining, tmp_path):
    model, _ = small_pretraining
    momentum = {"cls/predictions/transform/dense/kernel/Momentum": np.zeros((32, 32), np.float32)}
    write_tf1_checkpoint(model, tmp_path, **momentum)
    prefix = str(tmp_path / "bert_model.ckpt")
    assert formats.detect_format(prefix) == "tf1"
    # Only Adam's slots are known optimizer state; anything else is an unknown name.
    with pytest.raises(ConvertError, match=r"bert_model\.ckpt: unknown weight name\(s\) "
                       r"\['cls/predictions/transform/dense/kernel/Momentum'\]"):  # fmt: skip
        formats.convert(prefix, str(tmp_path / "dst"), "bertjax", fmt="tf1", do_lower_case=True)
    assert not (tmp_path / "dst").exists()
