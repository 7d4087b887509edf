"""HF PyTorch BERT directories read and written, against HF transformers' own outputs.

References: HuggingFace ``transformers`` (PyTorch, fp32) for every number and for what a valid
HF directory is (``from_pretrained`` with no missing or unexpected keys). Run with ``-s`` to see
the max abs differences. Fine-tuned exports: ``tasks_export_test.py``.
"""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bertjax.interop import formats, hf
from bertjax.interop.converted import Converted, ConvertError
from bertjax.model.heads import BertForPreTraining, BertModel
from bertjax.training import checkpoint
from tests.interop.references import (
    MINILM,
    TOL,
    batch,
    leaves,
    loaded_cleanly,
    state_dicts_equal,
    torch_inputs,
)


def pretraining_diffs(conv: Converted, hf_model, seed: int = 0) -> tuple[float, float]:
    """Max abs differences of (MLM logits at 4 positions per row, NSP logits) against HF."""
    ids, segments, mask = batch(seed)
    positions = np.array([[1, 3, 5, 7], [2, 9, 12, 14]], np.int32)
    with torch.no_grad():
        ref = hf_model(**torch_inputs(ids, segments, mask))
    ref_mlm = np.take_along_axis(ref.prediction_logits.numpy(), positions[..., None], axis=1)
    out = jax.jit(BertForPreTraining(conv.config).apply)({"params": conv.params}, jnp.asarray(ids),
                                                jnp.asarray(segments), jnp.asarray(mask),
                                                jnp.asarray(positions))  # fmt: skip
    mlm = float(np.abs(np.asarray(out.mlm_logits) - ref_mlm).max())
    nsp = float(np.abs(np.asarray(out.nsp_logits) - ref.seq_relationship_logits.numpy()).max())
    return mlm, nsp


def test_minilm_parity_with_hf():
    conv = formats.load(str(MINILM))
    assert conv.config.hidden_act == "gelu" and conv.do_lower_case and conv.task is None
    assert sorted(conv.params) == ["encoder", "pooler"]
    ids, segments, mask = batch(0, batch=3, length=12)
    hf_model = transformers.BertModel.from_pretrained(MINILM).eval()
    with torch.no_grad():
        ref = hf_model(**torch_inputs(ids, segments, mask))
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
    conv = formats.load(str(path))
    assert conv.config.hidden_act == "gelu_tanh" and conv.config.num_layers == 12
    mlm, nsp = pretraining_diffs(conv, model)
    print(f"\nbase BertForPreTraining parity: MLM logits max abs diff {mlm:.3g}, NSP {nsp:.3g}")
    assert mlm <= TOL and nsp <= TOL


def test_round_trip_minilm_bertmodel_bit_exact(tmp_path):
    conv = formats.load(str(MINILM))
    checkpoint.save_params(tmp_path / "bj", conv.params, conv.config, conv.vocab_file, True)
    formats.convert(str(tmp_path / "bj"), str(tmp_path / "hf"), "hf")
    back = loaded_cleanly(transformers.BertModel, tmp_path / "hf")
    state_dicts_equal(transformers.BertModel.from_pretrained(MINILM), back)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["hidden_act"] == "gelu"


def test_old_names_and_unprefixed_pytorch_bin(small_pretraining, tmp_path):
    model, path = small_pretraining
    reference = formats.load(str(path))
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
    conv = formats.load(str(hf_dir), do_lower_case=False)
    assert sorted(conv.params) == ["encoder", "pooler"] and conv.do_lower_case is False
    for part in ("encoder", "pooler"):
        for (_, a), (_, b) in zip(leaves(conv.params[part]), leaves(reference.params[part]),
                                  strict=True):  # fmt: skip
            np.testing.assert_array_equal(a, b)


def test_masked_lm_checkpoint_gives_its_encoder(small_pretraining, tmp_path):
    """Hub checkpoints often name BertForMaskedLM (no pooler, no NSP): its encoder and MLM head
    are read (a fine-tuning init), while HF export refuses the combination in one line."""
    model, _ = small_pretraining
    torch.manual_seed(3)
    masked_lm = transformers.BertForMaskedLM(model.config).eval()
    path = tmp_path / "mlm"
    masked_lm.save_pretrained(path)
    shutil.copyfile(MINILM / "vocab.txt", path / "vocab.txt")
    conv = formats.load(str(path), do_lower_case=True)
    assert sorted(conv.params) == ["encoder", "mlm"] and conv.task is None
    query = conv.params["encoder"]["layers"]["layer_1"]["attention"]["query"]["kernel"]
    np.testing.assert_array_equal(  # [H, N, D] <- HF's [N*D, H]
        query.reshape(32, 32),
        masked_lm.bert.encoder.layer[1].attention.self.query.weight.detach().T,
    )
    with pytest.raises(ConvertError, match=r"heads \['mlm'\]: HF export needs pooler\+mlm\+nsp"):
        hf.write(str(tmp_path / "out"), conv)
    assert not (tmp_path / "out").exists()


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
    ("labels", r"config\.json: id2label=\{'1': 'a'\}, expected ids 0\.\.n-1 -> names"),
    ("task_weights", r"a BertForQuestionAnswering needs the weights of \['span'\], found "
                     r"\['mlm', 'nsp', 'pooler', 'span'\]"),
])  # fmt: skip
def test_bad_inputs_name_file_and_key(small_pretraining, tmp_path, breakage, expected):
    from safetensors.numpy import load_file, save_file

    src = tmp_path / "src"
    shutil.copytree(small_pretraining[1], src)
    weights, config_path = src / "model.safetensors", src / "config.json"
    config = json.loads(config_path.read_text())
    if breakage == "missing_vocab":
        (src / "vocab.txt").unlink()
    elif breakage == "vocab_size":
        lines = (src / "vocab.txt").read_text(encoding="utf-8").splitlines(keepends=True)
        (src / "vocab.txt").write_text("".join(lines[:-1]), encoding="utf-8")
    elif breakage == "shape":
        config_path.write_text(json.dumps({**config, "intermediate_size": 65}))
    elif breakage == "labels":
        architectures = ["BertForTokenClassification"]
        config_path.write_text(
            json.dumps({**config, "id2label": {"1": "a"}, "architectures": architectures})
        )
    elif breakage in ("unknown", "missing_weight", "task_weights"):
        tensors = load_file(weights)
        if breakage == "unknown":
            tensors["classifier.weight"] = np.zeros((2, 32), np.float32)
        elif breakage == "task_weights":  # a QA config over pretraining weights plus qa_outputs
            tensors["qa_outputs.weight"] = np.zeros((2, 32), np.float32)
            tensors["qa_outputs.bias"] = np.zeros((2,), np.float32)
            architectures = ["BertForQuestionAnswering"]
            config_path.write_text(json.dumps({**config, "architectures": architectures}))
        else:
            del tensors["cls.seq_relationship.bias"]
        save_file(tensors, weights, metadata={"format": "pt"})
    elif breakage == "corrupt":
        weights.write_bytes(b"not a safetensors file")
    else:
        weights.unlink()
    with pytest.raises(ConvertError, match=expected):
        formats.convert(str(src), str(tmp_path / "dst"), "bertjax")
    assert not (tmp_path / "dst").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["src"]  # no temporary left behind


def test_untied_decoder_is_rejected(small_pretraining, tmp_path):
    from safetensors.numpy import load_file, save_file

    src = tmp_path / "src"
    shutil.copytree(small_pretraining[1], src)
    tensors = load_file(src / "model.safetensors")
    tensors["cls.predictions.decoder.weight"] = (
        tensors["bert.embeddings.word_embeddings.weight"] + 1
    )
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConvertError, match="decoder.weight' is not tied"):
        formats.load(str(src))


def test_overwrite(small_pretraining, tmp_path):
    (tmp_path / "dst").mkdir()
    with pytest.raises(ConvertError, match="already exists"):
        formats.convert(str(small_pretraining[1]), str(tmp_path / "dst"), "hf")
    formats.convert(str(small_pretraining[1]), str(tmp_path / "dst"), "hf", overwrite=True)
    replaced = loaded_cleanly(transformers.BertForPreTraining, tmp_path / "dst")
    state_dicts_equal(small_pretraining[0], replaced)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst"]
