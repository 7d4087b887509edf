"""The 'modernbert' architecture against transformers 4.57.6's ``modeling_modernbert.py`` (eager
attention, float32, CPU) with random weights, through ``bertjax.interop.modernbert``'s name
table: ``ModernBertModel``'s hidden states and ``ModernBertForMaskedLM``'s logits at every real
position, for sequences longer than the local window (global layers 0 and 3 of 5, local 1, 2,
4), padded batches, packed rows (each instance against itself run alone), the gathered last
layer, and configs with and without biases. The HF -> bertjax -> HF round trip is bit-exact."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bertjax.interop import modernbert as interop
from bertjax.model import heads
from bertjax.model.config import BertConfig

LENGTH = 40  # above the window (local_attention 16: 8 keys on each side)


def _hf_config(**changes):
    values = dict(
        vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=5,
        num_attention_heads=4, max_position_embeddings=64, local_attention=16,
        global_attn_every_n_layers=3, global_rope_theta=160000.0, local_rope_theta=10000.0,
        pad_token_id=0, attn_implementation="eager",
    )  # fmt: skip
    values.update(changes)
    return transformers.ModernBertConfig(**values)


def _hf_model(config, seed=0):
    torch.manual_seed(seed)
    model = transformers.ModernBertForMaskedLM(config).eval()
    with torch.no_grad():  # norms and biases away from their init, so that each one matters;
        for name, p in model.named_parameters():  # peaked attention, so that positions matter
            if "norm" in name or name.endswith(".bias"):
                p.add_(0.3 * torch.randn_like(p))
            if "Wqkv" in name:
                p.mul_(15.0)
    return model


def _bertjax(hf_model, name="test"):
    cfg = interop.config_from_hf(hf_model.config.to_dict(), name)
    tensors = {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}
    return cfg, interop.to_params(tensors, cfg, name)


def _run(cfg, params, ids, mask, positions=None, output_positions=None):
    """(encoder outputs, numpy logits), in one jitted program per config and shapes: eagerly,
    each op (and each layer's attention kernel) would compile on its own."""
    states, logits = _jitted_run(cfg, params, ids, mask, positions, output_positions)
    return states, np.asarray(logits)


@functools.partial(jax.jit, static_argnums=0)
def _jitted_run(cfg, params, ids, mask, positions, output_positions):
    model = heads.BertForMaskedLM(cfg)
    encoder = heads.BertEncoder(cfg)
    segment_ids = jnp.zeros_like(ids)
    states = encoder.apply({"params": params["encoder"]}, ids, segment_ids, mask,
                           output_hidden_states=output_positions is None, positions=positions,
                           output_positions=output_positions)  # fmt: skip
    at = output_positions
    if at is None:
        at = jnp.broadcast_to(jnp.arange(ids.shape[1], dtype=jnp.int32), ids.shape)
    logits = model.apply({"params": params}, ids, segment_ids, mask, at, positions=positions)
    return states, logits


def _batch(seed=1, batch=3, lengths=(LENGTH, 29, 11)):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 101, size=(batch, LENGTH)).astype(np.int32)
    mask = (np.arange(LENGTH)[None] < np.array(lengths)[:, None]).astype(np.int32)
    return ids * mask, mask


@pytest.mark.parametrize("biases", [False, True], ids=["no_biases", "biases"])
def test_model_and_masked_lm_equal_transformers_at_every_real_position(biases):
    flags = dict(attention_bias=biases, mlp_bias=biases, norm_bias=biases, classifier_bias=biases)
    hf = _hf_model(_hf_config(**flags))
    cfg, params = _bertjax(hf)
    assert [cfg.window(i) for i in range(5)] == [None, 8, 8, None, 8]
    ids, mask = _batch()
    with torch.no_grad():
        want = hf(torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                  output_hidden_states=True)  # fmt: skip
    states, logits = _run(cfg, params, ids, mask)
    real = mask.astype(bool)
    got_all = (*states.hidden_states, states.sequence_output)
    with torch.no_grad():
        want_all = (*want.hidden_states, hf.model.final_norm(want.hidden_states[-1]))
    assert len(got_all) == len(want_all) == 7
    for i, (got, exp) in enumerate(zip(got_all, want_all, strict=True)):
        exp = exp.numpy()
        scale = np.abs(exp[real]).max()
        np.testing.assert_allclose(np.asarray(got)[real] / scale, exp[real] / scale,
                                   atol=1e-5, rtol=0, err_msg=f"hidden state {i}")  # fmt: skip
    exp = want.logits.numpy()
    np.testing.assert_allclose(logits[real] / np.abs(exp).max(), exp[real] / np.abs(exp).max(),
                               atol=1e-5, rtol=0)  # fmt: skip


def test_the_window_is_what_makes_local_layers_differ():
    """A control: the same weights with every layer global differ from HF beyond the window."""
    hf = _hf_model(_hf_config())
    cfg, params = _bertjax(hf)
    ids, mask = _batch()
    _, local = _run(cfg, params, ids, mask)
    _, global_only = _run(cfg.replace(global_attn_every_n_layers=1), params, ids, mask)
    scale = np.abs(local).max()  # the equality tests allow 1e-5 of it
    assert np.abs(local - global_only)[0, 20:].max() > 1e-4 * scale  # beyond the window: differ
    # The global RoPE base on local layers also changes the output.
    _, theta = _run(cfg.replace(local_rope_theta=cfg.global_rope_theta), params, ids, mask)
    assert np.abs(local - theta).max() > 1e-4 * scale


def test_packed_rows_equal_each_instance_alone_and_the_gathered_layer_its_rows():
    hf = _hf_model(_hf_config())
    cfg, params = _bertjax(hf)
    ids, _ = _batch(seed=2, batch=1, lengths=(LENGTH,))
    cut = 23  # two instances: rows 0..22 and 23..39, positions restarting at 0
    sequence_ids = np.where(np.arange(LENGTH) < cut, 1, 2)[None].astype(np.int32)
    positions = np.where(np.arange(LENGTH) < cut, np.arange(LENGTH), np.arange(LENGTH) - cut)
    positions = positions[None].astype(np.int32)
    _, packed = _run(cfg, params, ids, sequence_ids, positions=positions)
    for part in (slice(0, cut), slice(cut, LENGTH)):
        with torch.no_grad():
            alone = hf(torch.tensor(ids[:, part], dtype=torch.long)).logits.numpy()
        scale = np.abs(alone).max()
        np.testing.assert_allclose(packed[:, part] / scale, alone / scale, atol=1e-5, rtol=0)
    at = np.array([[0, 5, 22, 23, 31, 39]], dtype=np.int32)
    states, gathered = _run(cfg, params, ids, sequence_ids, positions=positions,
                            output_positions=at)  # fmt: skip
    assert states.sequence_output.shape == (1, 6, cfg.hidden_size)
    np.testing.assert_allclose(gathered, packed[:, at[0]], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["tpu_interpret", "gpu_interpret"])
def test_the_fused_kernels_run_the_local_layers_as_the_xla_path(kernel):
    """The model with each flash kernel (interpret mode) gives the XLA path's logits: the
    local layers' window reaches the kernels."""
    hf = _hf_model(_hf_config())
    cfg, params = _bertjax(hf)
    ids, mask = _batch()
    _, xla = _run(cfg, params, ids, mask)
    _, fused = _run(cfg.replace(attention_impl=kernel), params, ids, mask)
    real = mask.astype(bool)
    np.testing.assert_allclose(fused[real], xla[real], rtol=1e-5, atol=1e-5 * np.abs(xla).max())


def test_round_trip_is_bit_exact_and_reads_what_it_writes():
    hf = _hf_model(_hf_config(attention_bias=True, mlp_bias=True, norm_bias=True))
    cfg, params = _bertjax(hf)
    tensors = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    back = interop.from_params(params, cfg)
    assert set(back) == set(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)
    config = transformers.ModernBertConfig(**interop.config_to_hf(cfg))
    assert interop.config_from_hf(config.to_dict(), "again") == cfg


def test_bad_checkpoints_are_one_line_errors():
    hf = _hf_model(_hf_config())
    cfg, _ = _bertjax(hf)
    tensors = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    del tensors["model.layers.2.mlp.Wi.weight"]
    with pytest.raises(interop.ConvertError, match=r"^ck: missing tensor 'model.layers.2.mlp.Wi"):
        interop.to_params(tensors, cfg, "ck")
    tensors["model.layers.2.mlp.Wi.weight"] = np.zeros((48, 32), np.float32)
    with pytest.raises(interop.ConvertError, match=r"Wi.weight has shape \(48, 32\); the config"):
        interop.to_params(tensors, cfg, "ck")
    values = hf.config.to_dict()
    with pytest.raises(interop.ConvertError, match="embedding_dropout and mlp_dropout differ"):
        interop.config_from_hf({**values, "mlp_dropout": 0.1}, "c.json")
    with pytest.raises(interop.ConvertError, match=r"^c.json: missing 'hidden_size'"):
        interop.config_from_hf({k: v for k, v in values.items() if k != "hidden_size"}, "c.json")
    with pytest.raises(interop.ConvertError, match=r"BertConfig.local_attention=0"):
        interop.config_from_hf({**values, "local_attention": 0}, "c.json")


def test_modernbert_configs_refuse_what_they_cannot_run():
    """scan_layers (its layers differ) and an unknown architecture are one-line errors."""
    base = dict(vocab_size=101, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48)
    with pytest.raises(ValueError, match=r"BertConfig.scan_layers=True: expected False with"):
        BertConfig(**base, architecture="modernbert", scan_layers=True)
    with pytest.raises(ValueError, match=r"BertConfig.architecture='gpt'"):
        BertConfig(**base, architecture="gpt")
    bert = BertConfig(**base)
    assert bert.window(1) is None and not bert.has_local_layers


def test_a_train_step_on_a_2x2x2_mesh_equals_one_device():
    """Three pretraining steps (bertjax.main's build_steps) of a 'modernbert' model with local
    layers: the (data, fsdp, tensor) mesh splits the GLU's <H, 2, F> kernel over fsdp and tensor
    and gives one device's losses and params."""
    from tests.pretrain import step_test  # noqa: PLC0415

    config = step_test.tiny_config()
    config.model.update(architecture="modernbert", local_attention=8, num_layers=3)
    one = step_test.run_steps(config, step_test.jax.devices()[:1], (1, 1, 1))
    mesh = step_test.run_steps(config, step_test.jax.devices(), (2, 2, 2))
    np.testing.assert_allclose(mesh[0], one[0], rtol=1e-5)
    for got, want in zip(
        step_test.jax.tree.leaves(mesh[1]), step_test.jax.tree.leaves(one[1]), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    kernel = mesh[2].params["encoder"]["layers"]["layer_1"]["intermediate"]["kernel"]
    assert kernel.shape == (32, 2, 64) and kernel.sharding.shard_shape(kernel.shape) == (16, 2, 32)
    assert "position_embeddings" not in one[1]["encoder"]["embeddings"]
    assert one[0][-1] < one[0][0]  # it trains


@pytest.mark.parametrize("name", ["ettin-17m", "ettin-32m", "ettin-68m", "ettin-150m",
                                  "ettin-400m", "ettin-1b", "modernbert-base",
                                  "modernbert-large"])  # fmt: skip
def test_the_sizes_have_their_published_parameter_counts(name):
    """Encoder + MLM head (HF's ModernBertForMaskedLM, decoder tied), counted from the shapes:
    within 5% of the name's rounded count (ModernBERT-base 149M and -large 395M, as published)."""
    from bertjax.model.config import MODERN_SIZES  # noqa: PLC0415

    cfg = BertConfig(**MODERN_SIZES[name])
    ids = np.zeros((1, 8), np.int32)
    shapes = jax.eval_shape(
        lambda: heads.BertForMaskedLM(cfg).init(jax.random.key(0), ids, ids, ids + 1, ids)
    )
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
    published = {"base": 149e6, "large": 395e6, "1b": 1e9}.get(name.split("-")[1])
    if published is None:
        published = float(name.split("-")[1].rstrip("m")) * 1e6
    assert abs(count / published - 1) < 0.05, (name, count)
