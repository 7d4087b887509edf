"""ModernBERT checkpoints through ``bertjax.interop.hf``: a 'modernbert' bertjax checkpoint
exports to a directory transformers 4.57.6 loads as ``ModernBertForMaskedLM`` (or
``ModernBertModel``) with no missing or unexpected keys and the same outputs; reading it back
is bit-exact; ModernBERT's own directories, with a BPE ``tokenizer.json`` and no vocab.txt,
are one line."""

import json

import jax
import numpy as np
import pytest
import torch
import transformers

from bertjax.interop import hf
from bertjax.interop.converted import Converted, ConvertError
from bertjax.model import heads
from tests.model import modernbert_test as cases


def _converted(tmp_path, mlm=True, vocab_size=40):
    model = cases._hf_model(cases._hf_config(vocab_size=vocab_size))
    cfg, params = cases._bertjax(model)
    if not mlm:
        params = {"encoder": params["encoder"]}
    else:  # a pretraining checkpoint's pooler and NSP head, which ModernBERT has not
        params = {**params, "pooler": {"dense": {}}, "nsp": {"dense": {}}}
    # In C order, as a checkpoint restores them (the conversion's transposes must not leak into
    # the files: safetensors writes a transposed view's buffer as it lies).
    params = jax.tree.map(np.ascontiguousarray, params)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                               + [f"w{i}" for i in range(35)]) + "\n")  # fmt: skip
    return Converted(params, cfg, str(vocab), True)


def test_export_loads_in_transformers_with_the_same_logits_and_reads_back_bit_exactly(tmp_path):
    conv = _converted(tmp_path)
    dst = hf.write(str(tmp_path / "hf"), conv)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["ModernBertForMaskedLM"]
    assert (config["pad_token_id"], config["cls_token_id"], config["sep_token_id"]) == (0, 2, 3)
    model, info = transformers.ModernBertForMaskedLM.from_pretrained(
        dst, output_loading_info=True, attn_implementation="eager"
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids = np.random.default_rng(0).integers(5, 40, size=(2, 30)).astype(np.int32)
    mask = np.ones_like(ids)
    with torch.no_grad():
        want = model.eval()(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    positions = np.broadcast_to(np.arange(30), ids.shape).astype(np.int32)
    apply = jax.jit(heads.BertForMaskedLM(conv.config).apply)  # one compile, not op by op
    got = apply({"params": conv.params}, ids, ids * 0, mask, positions)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5 * np.abs(want).max(), rtol=0)
    back = hf.read(dst)
    assert back.config == conv.config and set(back.params) == {"encoder", "mlm"}
    for head in ("encoder", "mlm"):
        for a, b in zip(_leaves(back.params[head]), _leaves(conv.params[head]), strict=True):
            assert a[0] == b[0]
            np.testing.assert_array_equal(a[1], b[1], err_msg=a[0])


def _leaves(tree, prefix=""):
    for key in sorted(tree):
        if isinstance(tree[key], dict):
            yield from _leaves(tree[key], f"{prefix}{key}/")
        else:
            yield f"{prefix}{key}", np.asarray(tree[key])


def test_encoder_only_params_export_as_modernbertmodel(tmp_path):
    dst = hf.write(str(tmp_path / "hf"), _converted(tmp_path, mlm=False))
    model, info = transformers.ModernBertModel.from_pretrained(dst, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_a_modernbert_directory_without_a_usable_tokenizer_is_one_line(tmp_path):
    dst = hf.write(str(tmp_path / "hf"), _converted(tmp_path))
    (tmp_path / "hf" / "vocab.txt").unlink()
    with pytest.raises(ConvertError, match=r"a ModernBERT directory without vocab.txt or tok"):
        hf.read(dst)
    (tmp_path / "hf" / "tokenizer.json").write_text("{}")
    with pytest.raises(ConvertError, match=r"tokenizer.json: not a HF tokenizer.json with a mod"):
        hf.read(dst)


def test_a_bpe_checkpoint_exports_its_tokenizer_json_which_transformers_reads_as_bertjax(
    tmp_path,
):
    """A 'modernbert' checkpoint whose vocab is a byte-level BPE tokenizer.json (``bertjax.vocab
    --type=bpe``, ModernBERT's layout): the export carries it, transformers' AutoTokenizer loads
    the directory and gives bertjax's BPE ids with [CLS] ... [SEP], and reading it back takes
    the tokenizer.json (no vocab.txt, as in ModernBERT's own directories)."""
    from bertjax.data import bundled, tokenization, vocab  # noqa: PLC0415

    bpe = tmp_path / "tokenizer.json"
    vocab.train_bpe([bundled.bundled_paths().eval], str(bpe), 300, do_lower_case=False)
    conv = _converted(tmp_path, vocab_size=300)  # the bytes, the specials and 39 merges
    conv = Converted(conv.params, conv.config, str(bpe), False)
    dst = hf.write(str(tmp_path / "hf"), conv)
    assert not (tmp_path / "hf" / "vocab.txt").exists()
    tokenizer = transformers.AutoTokenizer.from_pretrained(dst)
    ours = tokenization.create_tokenizer("bpe", str(bpe), False)
    text = "In the beginning God created the heaven"
    want = tokenizer(text)["input_ids"]
    assert want == [ours.cls_id, *ours.encode([text])[0], ours.sep_id]
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["cls_token_id"], config["sep_token_id"]) == (ours.cls_id, ours.sep_id)
    back = hf.read(dst)
    assert back.vocab_file.endswith("tokenizer.json") and not back.do_lower_case
    for a, b in zip(jax.tree.leaves(back.params), jax.tree.leaves(conv.params), strict=True):
        np.testing.assert_array_equal(a, b)


def test_continued_pretraining_takes_the_exported_architecture_and_rope_bases(tmp_path):
    """``config.init_checkpoint`` = an exported ModernBERT directory: the run's model is the
    checkpoint's ('modernbert', its window and RoPE bases), its encoder and MLM head are loaded
    and the pooler and NSP head drawn fresh; a RoPE base set on the command line wins."""
    import importlib.util  # noqa: PLC0415

    from bertjax.pretrain import continued  # noqa: PLC0415
    from tests.commands.tiny_run import REPO  # noqa: PLC0415

    conv = _converted(tmp_path)
    conv.config = conv.config.replace(global_rope_theta=20_000.0, local_rope_theta=5_000.0)
    dst = hf.write(str(tmp_path / "hf"), conv)
    spec = importlib.util.spec_from_file_location("continue_config", REPO / "configs/continue.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for command_line, global_theta in (({}, 20_000.0), ({"model.global_rope_theta": 1e6}, 1e6)):
        config = module.get_config().unlock()
        config.init_checkpoint = dst
        config.data.max_seq_length = 64
        config.model.global_rope_theta = command_line.get("model.global_rope_theta", 160_000.0)
        run, found = continued.resolve(config.lock(), command_line)
        assert (run.model.architecture, run.model.local_attention) == ("modernbert", 16)
        assert (run.model.global_rope_theta, run.model.local_rope_theta) == (global_theta, 5e3)
        assert set(found.params) == {"encoder", "mlm"} and found.fresh == ("pooler", "nsp")


def test_a_bpe_modernbert_directory_continues_pretraining_mlm_only_and_resumes_without_it(
    tmp_path, capsys
):
    """``configs/tiny.py`` with ``config.init_checkpoint`` = a ModernBERT directory holding only
    a BPE tokenizer.json: the run is the checkpoint's architecture, tokenizes with its BPE
    (the workdir keeps the tokenizer.json), and trains MLM without NSP, which ModernBERT never
    had; deleted after the first save, the directory is not needed to resume, and the resumed
    run keeps the objective."""
    import shutil  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from bertjax.data import bundled, vocab  # noqa: PLC0415
    from bertjax.pretrain import loop  # noqa: PLC0415
    from tests.commands import tiny_run  # noqa: PLC0415

    bpe = tmp_path / "tokenizer.json"
    vocab.train_bpe([bundled.bundled_paths().eval], str(bpe), 300, do_lower_case=False)
    conv = _converted(tmp_path, vocab_size=300)
    dst = hf.write(str(tmp_path / "hf"), Converted(conv.params, conv.config, str(bpe), False))
    corpus = tiny_run.write_env(tmp_path)
    sys.path.insert(0, str(tiny_run.REPO / "configs"))
    import tiny  # noqa: PLC0415

    def run(num_steps):
        config = tiny.get_config().unlock()
        config.init_checkpoint = dst
        config.data.update(input_files=[str(corpus)], eval_input_files=[str(corpus)],
                           max_seq_length=32, max_predictions_per_seq=5,
                           cache_dir=str(tmp_path / "cache"))  # fmt: skip
        config.train.update(num_steps=num_steps, global_batch_size=8, eval_every=0, log_every=1)
        loop.train_and_evaluate(config.lock(), str(tmp_path / "run"), {})
        return capsys.readouterr().out

    out = run(2)
    assert "architecture bert -> modernbert" in out and "/hf/tokenizer.json (300 entries" in out
    assert "objective: MLM without NSP" in out, out
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(steps) == 2 and all("mlm_acc" in s and "nsp" not in s for s in steps), out
    assert (tmp_path / "run" / "tokenizer.json").read_bytes() == bpe.read_bytes()
    shutil.rmtree(tmp_path / "hf")
    out = run(3)
    assert "restored step 2 " in out and "objective: MLM without NSP" in out, out
    assert "step 3/3 " in out and " nsp_" not in out, out
