"""Encoder tests against references: HF PyTorch (parameter counts, causal-attention numerics),
the documented parameter layout (golden tree), and definitions (causality, padding, per-layer
dropout) checked on tiny models. Numerical parity on real weights is in interop/hf_test.py.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import linen as nn

from bertjax.interop import formats
from bertjax.model.config import BertConfig
from bertjax.model.encoder import stack_layers, unstack_layers
from bertjax.model.heads import BertModel
from tests.model.sizes import config_for_size, count_params

TINY = BertConfig(vocab_size=13, hidden_size=8, num_layers=2, num_heads=2, intermediate_size=12,
                  max_position_embeddings=10, type_vocab_size=2)  # fmt: skip


def _inputs(batch=2, length=6, vocab=13, seed=0):
    """numpy ids, segments, mask: edited and compared on the host (each eager jnp op on a new
    shape would compile on its own)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, (batch, length)).astype(np.int32)
    segments = (np.arange(length)[None].repeat(batch, 0) >= length // 2).astype(np.int32)
    return ids, segments, np.ones((batch, length), np.int32)


def _init(cfg: BertConfig, cls=BertModel, seed=0) -> dict:
    """Random numpy params in the model's tree (from eval_shape: no slow jitted initialiser)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: rng.normal(0, 0.3, x.shape).astype(x.dtype),
                        nn.unbox(_abstract(cfg, cls)))  # fmt: skip


def _abstract(cfg: BertConfig, cls=BertModel):
    ids = jax.ShapeDtypeStruct((1, 4), jnp.int32)
    return jax.eval_shape(cls(cfg).init, jax.random.key(0), ids, ids, ids)["params"]


def _count(cfg: BertConfig) -> int:
    return count_params(nn.unbox(_abstract(cfg)))


def _hf_config(cfg: BertConfig, **extra) -> transformers.BertConfig:
    return transformers.BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings, **extra)  # fmt: skip


def test_param_counts_equal_hf():
    # The figures for HF's BertModel (encoder + pooler).
    assert _count(config_for_size("base")) == 109_482_240
    assert _count(config_for_size("large")) == 335_141_888
    for size in ("tiny", "L6_H768_A3"):  # and HF itself, on the meta device (no memory)
        cfg = config_for_size(size)
        with torch.device("meta"):
            hf_count = sum(p.numel() for p in transformers.BertModel(_hf_config(cfg)).parameters())
        assert _count(cfg) == hf_count, size


def _golden_tree(cfg: BertConfig, scanned: bool) -> dict[str, tuple[tuple, tuple]]:
    """The layout documented in encoder.py's docstring: path -> (shape, logical axes)."""
    v, h, n, f = cfg.vocab_size, cfg.hidden_size, cfg.num_heads, cfg.intermediate_size
    d, p, t = h // n, cfg.max_position_embeddings, cfg.type_vocab_size
    golden = {
        "encoder/embeddings/word_embeddings/embedding": ((v, h), ("vocab", "embed")),
        "encoder/embeddings/position_embeddings/embedding": ((p, h), (None, "embed")),
        "encoder/embeddings/token_type_embeddings/embedding": ((t, h), (None, "embed")),
        "encoder/embeddings/layer_norm/scale": ((h,), ("embed",)),
        "encoder/embeddings/layer_norm/bias": ((h,), ("embed",)),
        "pooler/dense/kernel": ((h, h), ("embed", None)),
        "pooler/dense/bias": ((h,), (None,)),
    }
    layer = {}
    for name in ("query", "key", "value"):
        layer[f"attention/{name}/kernel"] = ((h, n, d), ("embed", "heads", "kv"))
        layer[f"attention/{name}/bias"] = ((n, d), ("heads", "kv"))
    layer["attention/output/kernel"] = ((n, d, h), ("heads", "kv", "embed"))
    layer["attention/output/bias"] = ((h,), ("embed",))
    layer["intermediate/kernel"] = ((h, f), ("embed", "mlp"))
    layer["intermediate/bias"] = ((f,), ("mlp",))
    layer["output/kernel"] = ((f, h), ("mlp", "embed"))
    layer["output/bias"] = ((h,), ("embed",))
    for norm in ("attention_layer_norm", "output_layer_norm"):
        layer[f"{norm}/scale"] = ((h,), ("embed",))
        layer[f"{norm}/bias"] = ((h,), ("embed",))
    for name, (shape, axes) in layer.items():
        if scanned:
            golden[f"encoder/layers/layer/{name}"] = ((cfg.num_layers, *shape), ("layers", *axes))
        else:
            for i in range(cfg.num_layers):
                golden[f"encoder/layers/layer_{i}/{name}"] = (shape, axes)
    return golden


@pytest.mark.parametrize("scanned", [False, True])
def test_golden_parameter_tree(scanned):
    cfg = TINY.replace(scan_layers=scanned)
    abstract = _abstract(cfg)
    got = {}
    is_box = lambda x: isinstance(x, nn.Partitioned)
    for path, leaf in jax.tree_util.tree_leaves_with_path(abstract, is_leaf=is_box):
        name = "/".join(k.key for k in path)
        assert is_box(leaf), f"{name} has no logical axis names"
        got[name] = (tuple(leaf.value.shape), tuple(leaf.names))
        assert leaf.value.dtype == jnp.float32
    assert got == _golden_tree(cfg, scanned)


@functools.partial(jax.jit, static_argnums=0, static_argnames=("output_hidden_states",))
def _apply(cfg, params, ids, segments, mask, output_hidden_states=False):
    return BertModel(cfg).apply({"params": params}, ids, segments, mask,
                                output_hidden_states=output_hidden_states)  # fmt: skip


def test_scan_layers_matches_unrolled():
    params = _init(TINY)
    ids, segments, mask = _inputs()
    ref = _apply(TINY, params, ids, segments, mask, output_hidden_states=True)
    stacked = {**params, "encoder": stack_layers(params["encoder"], TINY.num_layers)}
    scanned = _apply(TINY.replace(scan_layers=True), stacked, ids, segments, mask,
                     output_hidden_states=True)  # fmt: skip
    np.testing.assert_allclose(scanned.sequence_output, ref.sequence_output, atol=1e-6)
    np.testing.assert_allclose(scanned.pooled_output, ref.pooled_output, atol=1e-6)
    for a, b in zip(scanned.hidden_states, ref.hidden_states, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    back = unstack_layers(stacked["encoder"], TINY.num_layers)
    jax.tree.map(np.testing.assert_array_equal, back, params["encoder"])


def _loss_and_grad(cfg: BertConfig, params: dict):
    ids, segments, mask = _inputs()

    def loss(p):
        out = BertModel(cfg).apply({"params": p}, ids, segments, mask)
        return jnp.sum(out.sequence_output**2) + jnp.sum(out.pooled_output)

    if cfg.scan_layers:
        params = {**params, "encoder": stack_layers(params["encoder"], cfg.num_layers)}
    return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("policy,scanned", [("full", False), ("dots", True)])
def test_remat_does_not_change_outputs_or_grads(policy, scanned):
    params = _init(TINY)
    cfg = TINY.replace(scan_layers=scanned)
    ref_value, ref_grad = _loss_and_grad(cfg, params)
    value, grad = _loss_and_grad(cfg.replace(remat_policy=policy), params)
    np.testing.assert_allclose(value, ref_value, rtol=1e-6)
    # Rematerialisation may reorder float ops: equal up to float32 rounding.
    check = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    jax.tree.map(check, grad, ref_grad)


def test_causal_attention_is_causal():
    cfg = TINY.replace(attention="causal")
    params = _init(cfg)
    ids, segments, mask = _inputs(batch=1, length=8)
    ref = np.asarray(_apply(cfg, params, ids, segments, mask).sequence_output)
    for j in (2, 5, 7):
        changed = np.asarray(_apply(cfg, params, _changed(ids, j), segments, mask).sequence_output)
        np.testing.assert_array_equal(changed[:, :j], ref[:, :j])
        assert np.abs(changed[:, j:] - ref[:, j:]).max() > 1e-4  # position j itself does see it
    bidirectional = np.asarray(_apply(TINY, params, _changed(ids, 5), segments, mask)
                               .sequence_output)  # fmt: skip
    assert np.abs(bidirectional[:, :5] - np.asarray(_apply(TINY, params, ids, segments, mask)
                  .sequence_output)[:, :5]).max() > 1e-4  # fmt: skip


def _changed(ids, j):
    """``ids`` with row 0's token at ``j`` replaced by another."""
    ids = ids.copy()
    ids[0, j] = (ids[0, j] % 12) + 1
    return ids


def test_causal_attention_matches_hf_decoder(tmp_path):
    # HF's BertModel with is_decoder=True applies a causal mask; the converter maps it to ours.
    torch.manual_seed(0)
    hf_model = transformers.BertModel(_hf_config(TINY, is_decoder=True)).eval()
    hf_model.save_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_text("".join(f"t{i}\n" for i in range(TINY.vocab_size)))
    conv = formats.load(str(tmp_path), do_lower_case=True)
    assert conv.config.attention == "causal"
    ids, segments, mask = _inputs(batch=2, length=6)
    mask = mask.copy()
    mask[0, 4:] = 0
    with torch.no_grad():
        ref = hf_model(input_ids=torch.tensor(np.asarray(ids), dtype=torch.long),
                       token_type_ids=torch.tensor(np.asarray(segments), dtype=torch.long),
                       attention_mask=torch.tensor(np.asarray(mask), dtype=torch.long))  # fmt: skip
    out = _apply(conv.config, conv.params, ids, segments, mask)
    real = np.asarray(mask, bool)
    diff = np.abs(np.asarray(out.sequence_output) - ref.last_hidden_state.numpy())[real].max()
    print(f"\ncausal encoder vs HF is_decoder: max abs diff {diff:.3g}")
    assert diff <= 1e-5


def test_padding_is_ignored():
    params = _init(TINY)
    ids, segments, _ = _inputs(batch=1, length=8)
    real = 5
    mask = (np.arange(8)[None] < real).astype(np.int32)
    alone = _apply(TINY, params, ids[:, :real], segments[:, :real], mask[:, :real])
    for seed in (1, 2):
        junk = np.random.default_rng(seed).integers(0, 13, (1, 8)).astype(np.int32)
        padded_ids = np.where(mask == 1, ids, junk)
        padded_segments = np.where(mask == 1, segments, junk % 2)
        out = _apply(TINY, params, padded_ids, padded_segments, mask)
        np.testing.assert_allclose(np.asarray(out.sequence_output)[:, :real],
                                   alone.sequence_output, atol=1e-6)  # fmt: skip
        np.testing.assert_allclose(out.pooled_output, alone.pooled_output, atol=1e-6)


def _dropout_probe_params(cfg: BertConfig, scanned: bool) -> dict:
    """Params making every layer's output LN(dropout(ones)): a function of its dropout mask only.

    The attention block's LayerNorm has scale 0 (output 0 whatever the input); the FFN yields its
    output bias (ones) at every position, which goes through hidden dropout and a unit LayerNorm.
    """
    params = jax.tree.map(np.zeros_like, _init(cfg))
    for i in range(cfg.num_layers):
        layer = params["encoder"]["layers"][f"layer_{i}"]
        layer["output"]["bias"] = np.ones_like(layer["output"]["bias"])
        layer["output_layer_norm"]["scale"] = np.ones_like(layer["output_layer_norm"]["scale"])
    if scanned:
        params["encoder"] = stack_layers(params["encoder"], cfg.num_layers)
    return params


def test_dropout_masks_differ_per_layer_under_scan():
    cfg = TINY.replace(hidden_size=64, num_layers=3, hidden_dropout_rate=0.5,
                       attention_dropout_rate=0.0, scan_layers=True)  # fmt: skip
    params = _dropout_probe_params(cfg.replace(scan_layers=False), scanned=True)
    ids, segments, mask = _inputs()
    apply = functools.partial(BertModel(cfg).apply, deterministic=False, output_hidden_states=True)
    out = jax.jit(apply)(
        {"params": params}, ids, segments, mask, rngs={"dropout": jax.random.key(3)}
    )
    layers = [np.asarray(h) for h in out.hidden_states[1:]]
    for i in range(cfg.num_layers):
        assert np.abs(layers[i]).max() > 0.5  # a real mask, not all-kept / all-dropped
        for j in range(i):
            assert np.abs(layers[i] - layers[j]).max() > 0.5, (i, j)


def test_bf16_compute_runs():
    params = _init(TINY)
    ids, segments, mask = _inputs()
    ref = _apply(TINY, params, ids, segments, mask)
    out = _apply(TINY.replace(dtype="bfloat16"), params, ids, segments, mask)
    assert out.sequence_output.dtype == jnp.bfloat16 and params["pooler"]["dense"]["kernel"].dtype \
        == jnp.float32  # fmt: skip
    assert np.isfinite(np.asarray(out.sequence_output, np.float32)).all()
    np.testing.assert_allclose(np.asarray(out.sequence_output, np.float32), ref.sequence_output,
                               atol=0.1)  # fmt: skip


def test_sequence_longer_than_positions_is_a_clear_error():
    with pytest.raises(ValueError, match="sequence length 11 exceeds max_position_embeddings=10"):
        _apply(TINY, _init(TINY), *_inputs(length=11))
