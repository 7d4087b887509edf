"""Encoder tests against references: HF PyTorch (parameter counts, causal-attention numerics),
the documented parameter layout (golden tree), the paper's size grid, and definitions (causality,
padding, dropout) checked on tiny models. Numerical parity on real weights is in convert_test.py.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import linen as nn

from bertjax import convert, model
from bertjax.heads import BertModel
from bertjax.model import BertConfig

TINY = BertConfig(vocab_size=13, hidden_size=8, num_layers=2, num_heads=2, intermediate_size=12,
                  max_position_embeddings=10, type_vocab_size=2)  # fmt: skip


def _inputs(batch=2, length=6, vocab=13, seed=0):
    rng = np.random.default_rng(seed)
    ids = jnp.asarray(rng.integers(1, vocab, (batch, length)), jnp.int32)
    segments = jnp.asarray(np.arange(length)[None].repeat(batch, 0) >= length // 2, jnp.int32)
    return ids, segments, jnp.ones((batch, length), jnp.int32)


def _init(cfg: BertConfig, cls=BertModel, seed=0) -> dict:
    """Random numpy params in the model's tree (from eval_shape: no slow jitted initialiser)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: rng.normal(0, 0.3, x.shape).astype(x.dtype),
                        nn.unbox(_abstract(cfg, cls)))  # fmt: skip


def _abstract(cfg: BertConfig, cls=BertModel):
    ids = jax.ShapeDtypeStruct((1, 4), jnp.int32)
    return jax.eval_shape(cls(cfg).init, jax.random.key(0), ids, ids, ids)["params"]


def _count(cfg: BertConfig) -> int:
    return model.count_params(nn.unbox(_abstract(cfg)))


def _hf_config(cfg: BertConfig, **extra) -> transformers.BertConfig:
    return transformers.BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings, **extra)  # fmt: skip


def test_param_counts_equal_hf():
    # The figures for HF's BertModel (encoder + pooler).
    assert _count(model.config_for_size("base")) == 109_482_240
    assert _count(model.config_for_size("large")) == 335_141_888
    for size in ("tiny", "L6_H768_A3"):  # and HF itself, on the meta device (no memory)
        cfg = model.config_for_size(size)
        with torch.device("meta"):
            hf_count = sum(p.numel() for p in transformers.BertModel(_hf_config(cfg)).parameters())
        assert _count(cfg) == hf_count, size


def test_paper_size_grid_present():
    # Devlin et al. Table 6 (L, H, A) plus BERT-base and BERT-large; feed-forward size is 4H.
    grid = [(3, 768, 12), (6, 768, 3), (6, 768, 12), (12, 768, 12), (12, 1024, 16), (24, 1024, 16)]
    sizes = {(s["num_layers"], s["hidden_size"], s["num_heads"]): s for s in model.SIZES.values()}
    for lha in [*grid, (12, 768, 12), (24, 1024, 16)]:
        assert lha in sizes, lha
        assert sizes[lha]["intermediate_size"] == 4 * lha[1]
    assert model.config_for_size("base").num_layers == 12
    assert model.config_for_size("large").hidden_size == 1024
    with pytest.raises(ValueError, match="unknown model size 'huge'"):
        model.config_for_size("huge")


def _golden_tree(cfg: BertConfig, scanned: bool) -> dict[str, tuple[tuple, tuple]]:
    """The layout documented in model.py's docstring: path -> (shape, logical axes)."""
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
    stacked = {**params, "encoder": model.stack_layers(params["encoder"], TINY.num_layers)}
    scanned = _apply(TINY.replace(scan_layers=True), stacked, ids, segments, mask,
                     output_hidden_states=True)  # fmt: skip
    np.testing.assert_allclose(scanned.sequence_output, ref.sequence_output, atol=1e-6)
    np.testing.assert_allclose(scanned.pooled_output, ref.pooled_output, atol=1e-6)
    for a, b in zip(scanned.hidden_states, ref.hidden_states, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    back = model.unstack_layers(stacked["encoder"], TINY.num_layers)
    jax.tree.map(np.testing.assert_array_equal, back, params["encoder"])


def _loss_and_grad(cfg: BertConfig, params: dict):
    ids, segments, mask = _inputs()

    def loss(p):
        out = BertModel(cfg).apply({"params": p}, ids, segments, mask)
        return jnp.sum(out.sequence_output**2) + jnp.sum(out.pooled_output)

    if cfg.scan_layers:
        params = {**params, "encoder": model.stack_layers(params["encoder"], cfg.num_layers)}
    return jax.jit(jax.value_and_grad(loss))(params)


def test_flat_dense_dots_match_dot_general(monkeypatch):
    # CPU runs Dense as one 2-D GEMM over reshaped operands, TPU/GPU as a multi-dim dot_general:
    # the same function, so the same loss and gradients up to float32 rounding.
    params = _init(TINY)
    monkeypatch.setattr(model, "_flat_dense_dots", lambda: True)
    flat_value, flat_grad = _loss_and_grad(TINY, params)
    monkeypatch.setattr(model, "_flat_dense_dots", lambda: False)
    value, grad = _loss_and_grad(TINY, params)
    np.testing.assert_allclose(flat_value, value, rtol=1e-6)
    check = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    jax.tree.map(check, flat_grad, grad)


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
    ref = _apply(cfg, params, ids, segments, mask).sequence_output
    for j in (2, 5, 7):
        changed = _apply(cfg, params, ids.at[0, j].set((ids[0, j] % 12) + 1), segments,
                         mask).sequence_output  # fmt: skip
        np.testing.assert_array_equal(changed[:, :j], ref[:, :j])
        assert np.abs(changed[:, j:] - ref[:, j:]).max() > 1e-4  # position j itself does see it
    new_token = (ids[0, 5] % 12) + 1
    bidirectional = _apply(
        TINY, params, ids.at[0, 5].set(new_token), segments, mask
    ).sequence_output
    assert np.abs(bidirectional[:, :5] - _apply(TINY, params, ids, segments, mask)
                  .sequence_output[:, :5]).max() > 1e-4  # fmt: skip


def test_causal_attention_matches_hf_decoder(tmp_path):
    # HF's BertModel with is_decoder=True applies a causal mask; the converter maps it to ours.
    torch.manual_seed(0)
    hf_model = transformers.BertModel(_hf_config(TINY, is_decoder=True)).eval()
    hf_model.save_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_text("".join(f"t{i}\n" for i in range(TINY.vocab_size)))
    conv = convert.load(str(tmp_path), do_lower_case=True)
    assert conv.config.attention == "causal"
    ids, segments, mask = _inputs(batch=2, length=6)
    mask = mask.at[0, 4:].set(0)
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
    mask = jnp.asarray(np.arange(8)[None] < real, jnp.int32)
    alone = _apply(TINY, params, ids[:, :real], segments[:, :real], mask[:, :real])
    for seed in (1, 2):
        junk = jnp.asarray(np.random.default_rng(seed).integers(0, 13, (1, 8)), jnp.int32)
        padded_ids = jnp.where(mask == 1, ids, junk)
        padded_segments = jnp.where(mask == 1, segments, junk % 2)
        out = _apply(TINY, params, padded_ids, padded_segments, mask)
        np.testing.assert_allclose(out.sequence_output[:, :real], alone.sequence_output, atol=1e-6)
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
        params["encoder"] = model.stack_layers(params["encoder"], cfg.num_layers)
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


@pytest.mark.parametrize("changes,expected", [
    (dict(hidden_size=10, num_heads=4), r"BertConfig.hidden_size=10: expected a multiple of num_"),
    (dict(hidden_act="swish"), r"BertConfig.hidden_act='swish': expected one of"),
    (dict(num_layers=0), r"BertConfig.num_layers=0: expected a positive integer"),
    (dict(dtype="float8"), r"BertConfig.dtype='float8': expected one of"),
    (dict(attention="sparse"), r"BertConfig.attention='sparse': expected one of"),
    (dict(hidden_dropout_rate=1.0), r"BertConfig.hidden_dropout_rate=1.0: expected a rate"),
    (dict(remat_policy="some"), r"BertConfig.remat_policy='some': expected one of"),
    (dict(gather_last_layer="yes"), r"BertConfig.gather_last_layer='yes': expected a bool"),
])  # fmt: skip
def test_bad_config_fields_give_clear_errors(changes, expected):
    with pytest.raises(ValueError, match=expected):
        TINY.replace(**changes)


def test_config_json_round_trip_and_unknown_fields():
    assert BertConfig.from_dict(TINY.to_dict()) == TINY
    with pytest.raises(ValueError, match=r"my.json: unknown BertConfig fields \['hidden_layers'\]"):
        BertConfig.from_dict({"hidden_layers": 3}, source="my.json")
    with pytest.raises(ValueError, match="sequence length 11 exceeds max_position_embeddings=10"):
        _apply(TINY, _init(TINY), *_inputs(length=11))


def _seed(i: int) -> jax.Array:
    return jax.random.bits(jax.random.key(i), (2,), jnp.uint32)


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_dropout_mask_is_bernoulli_and_unbiased(rate):
    """Keep fraction within 5 sigma of a Binomial(n, 1 - rate) reference; E[out] = x exactly
    in expectation (scale uses the quantised keep probability); no correlation between
    neighbours along any axis, nor between two seeds; odd shapes work."""
    shape, n = (64, 128, 129), 64 * 128 * 129
    keep, scale = model.dropout_keep_mask(_seed(3), rate, shape)
    k = np.asarray(keep, np.float64)
    sigma = np.sqrt(rate * (1 - rate) / n)
    assert abs(k.mean() - (1 - rate)) < 5 * sigma
    threshold = round(rate * 2**32)
    assert scale == pytest.approx(2**32 / (2**32 - threshold), rel=1e-12)
    # Pearson correlations of independent Bernoullis over ~1M pairs: |r| < 5/sqrt(n) ~ 0.005.
    other = np.asarray(model.dropout_keep_mask(_seed(4), rate, shape)[0], np.float64)
    pairs = [
        (k[..., :-1], k[..., 1:]),  # next column
        (k[:, :-1], k[:, 1:]),  # next row
        (k[:-1], k[1:]),  # next leading index
        (k, other),  # another seed
    ]
    for a, b in pairs:
        assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 5 / np.sqrt(a.size)
    # Every row gets its own pattern (a row-only hash would repeat columns across rows).
    assert len({row.tobytes() for row in np.asarray(keep).reshape(-1, 129)[:4096]}) == 4096
    x = jnp.ones((256, 257))
    y = model.Dropout(rate).apply({}, x, False, rngs={"dropout": jax.random.key(4)})
    values = np.unique(np.asarray(y))
    assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(scale, rel=1e-6)
    assert model.Dropout(rate).apply({}, x, True) is x


def test_dropout_gradient_uses_the_forward_mask():
    """d/dx sum(c * dropout(x)) = c * mask * scale, with the mask of the forward pass."""
    x = jax.random.normal(jax.random.key(0), (8, 33, 17))
    c = jax.random.normal(jax.random.key(1), x.shape)
    seed = _seed(5)
    y = model.dropout(x, seed, 0.3)
    grad = jax.jit(jax.grad(lambda x: jnp.sum(c * model.dropout(x, seed, 0.3))))(x)
    keep = np.asarray(y) != 0
    scale = model.dropout_keep_mask(seed, 0.3, x.shape)[1]
    np.testing.assert_allclose(grad, np.where(keep, np.asarray(c) * scale, 0.0), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(y)[keep], np.asarray(x)[keep] * scale, rtol=1e-6)


def test_add_vocab_bias_gradient_matches_plain_add():
    logits = jax.random.normal(jax.random.key(0), (3, 5, 7))
    bias = jax.random.normal(jax.random.key(1), (7,))
    weights = jax.random.normal(jax.random.key(2), (3, 5, 7))
    loss = lambda add: lambda lg, b: jnp.sum(jnp.tanh(add(lg, b)) * weights)
    want = jax.grad(loss(jnp.add), argnums=(0, 1))(logits, bias)
    got = jax.grad(loss(model.add_vocab_bias), argnums=(0, 1))(logits, bias)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
