"""Heads against references: HF ``BertForPreTraining`` (PyTorch) logits and parameter counts, and a
direct numpy transcription of the MLM head (gather -> dense -> GELU -> LayerNorm -> tied decoder).
The BERT-base-size parity is in tests/interop/hf_test.py.
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
from bertjax.model.encoder import stack_layers
from bertjax.model.heads import BertForPreTraining, BertModel, MaskedLMHead
from tests.model.sizes import config_for_size, count_params

TINY_HF = dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=32, max_position_embeddings=16)  # fmt: skip


def hf_pretraining_dir(tmp_path, hidden_act: str):
    """A random HF BertForPreTraining of TINY_HF saved (with a vocab) to ``tmp_path``; returned."""
    torch.manual_seed(0)
    hf_model = transformers.BertForPreTraining(
        transformers.BertConfig(hidden_act=hidden_act, **TINY_HF)
    ).eval()
    hf_model.save_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_text("".join(f"t{i}\n" for i in range(TINY_HF["vocab_size"])))
    return hf_model


def pretraining_inputs():
    """ids, segment ids, mask (row 1 padded from 7) <int32>[2, 10] and positions <int32>[2, 3]."""
    rng = np.random.default_rng(0)
    ids = rng.integers(5, TINY_HF["vocab_size"], (2, 10)).astype(np.int32)
    segments = (np.arange(10)[None].repeat(2, 0) >= 6).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    positions = np.array([[1, 4, 8], [2, 3, 6]], np.int32)
    return ids, segments, mask, positions


@pytest.mark.parametrize("gather_last_layer", [True, False])
@pytest.mark.parametrize("hidden_act", ["gelu", "relu"])
def test_pretraining_logits_match_hf(tmp_path, hidden_act, gather_last_layer):
    hf_model = hf_pretraining_dir(tmp_path, hidden_act)
    conv = formats.load(str(tmp_path), do_lower_case=True)
    config = conv.config.replace(gather_last_layer=gather_last_layer)
    ids, segments, mask, positions = pretraining_inputs()
    with torch.no_grad():
        ref = hf_model(input_ids=torch.tensor(ids, dtype=torch.long),
                       token_type_ids=torch.tensor(segments, dtype=torch.long),
                       attention_mask=torch.tensor(mask, dtype=torch.long))  # fmt: skip
    out = jax.jit(BertForPreTraining(config).apply)({"params": conv.params}, ids, segments,
                                                    mask, positions)  # fmt: skip
    ref_mlm = np.take_along_axis(ref.prediction_logits.numpy(), positions[..., None], axis=1)
    assert out.mlm_logits.shape == (2, 3, 40) and out.mlm_logits.dtype == jnp.float32
    mlm = np.abs(np.asarray(out.mlm_logits) - ref_mlm).max()
    nsp = np.abs(np.asarray(out.nsp_logits) - ref.seq_relationship_logits.numpy()).max()
    print(f"\n{hidden_act}: MLM logits max abs diff {mlm:.3g}, NSP {nsp:.3g}")
    assert mlm <= 1e-5 and nsp <= 1e-5


GATHERED_CFG = BertConfig(vocab_size=40, hidden_size=16, num_layers=3, num_heads=4,
                          intermediate_size=32, max_position_embeddings=16)  # fmt: skip
GATHERED_POSITIONS = np.array([[1, 4, 8, 4], [2, 3, 6, 0]], np.int32)
GATHERED_WEIGHTS = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], np.float32)


@functools.cache
def _gathered_params():
    """GATHERED_CFG's unscanned params, as numpy: drawn once (jitted: eagerly, each op of the
    initialiser would compile on its own) for every case of the test below."""
    ids, segments, mask, _ = pretraining_inputs()
    init = jax.jit(BertForPreTraining(GATHERED_CFG).init)
    params = init(jax.random.key(0), ids, segments, mask, GATHERED_POSITIONS)["params"]
    return jax.tree.map(np.asarray, jax.device_get(nn.unbox(params)))


@pytest.mark.parametrize(
    "attention,scan_layers,remat_policy",
    [("bidirectional", False, "none"), ("causal", False, "full"), ("bidirectional", True, "dots")],
)
def test_gathered_last_layer_gives_the_full_model_loss_and_gradients(
    attention, scan_layers, remat_policy
):
    """The last layer at [CLS] + the masked positions only (the default) against the same model
    run at every position: same logits, and the same gradient for every parameter, including
    a causal mask (each query keeps its own row) and repeated/padding positions (0)."""
    cfg = GATHERED_CFG.replace(attention=attention, scan_layers=scan_layers,
                               remat_policy=remat_policy)  # fmt: skip
    ids, segments, mask, _ = pretraining_inputs()
    positions, weights = GATHERED_POSITIONS, GATHERED_WEIGHTS
    gathered, full = (
        BertForPreTraining(cfg),
        BertForPreTraining(cfg.replace(gather_last_layer=False)),
    )
    params = _gathered_params()  # attention and remat leave the tree as it is
    if scan_layers:
        params = {**params, "encoder": stack_layers(params["encoder"], cfg.num_layers)}

    def loss_and_grads(module):
        def loss(params):
            out = module.apply({"params": params}, ids, segments, mask, positions)
            mlm = jax.nn.log_softmax(out.mlm_logits)[..., 7] * weights
            return -mlm.sum() - jax.nn.log_softmax(out.nsp_logits)[:, 1].sum(), out

        return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

    (loss, out), grads = loss_and_grads(gathered)
    (ref_loss, ref_out), ref_grads = loss_and_grads(full)
    np.testing.assert_allclose(out.mlm_logits, ref_out.mlm_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.nsp_logits, ref_out.nsp_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    flat, ref_flat = jax.tree.leaves_with_path(grads), jax.tree.leaves(ref_grads)
    assert len(flat) == len(ref_flat) == 14 + 16 * (1 if scan_layers else 3)
    for (path, grad), ref in zip(flat, ref_flat, strict=True):
        # (the key bias's gradient is zero up to rounding: softmax ignores a per-query constant)
        scale = max(np.abs(ref).max(), 1e-6)
        np.testing.assert_allclose(grad, ref, rtol=0, atol=2e-5 * scale,
                                   err_msg=jax.tree_util.keystr(path))  # fmt: skip


def test_pretraining_param_count_equals_hf_tied_decoder():
    # HF counts the tied decoder once; an untied V x H decoder would add 23.4M at base size.
    cfg = config_for_size("base")
    ids = jax.ShapeDtypeStruct((1, 4), jnp.int32)
    positions = jax.ShapeDtypeStruct((1, 2), jnp.int32)
    abstract = jax.eval_shape(BertForPreTraining(cfg).init, jax.random.key(0), ids, ids, ids,
                              positions)  # fmt: skip
    with torch.device("meta"):
        hf_model = transformers.BertForPreTraining(transformers.BertConfig())
    hf_count = sum(p.numel() for p in hf_model.parameters())
    assert count_params(nn.unbox(abstract)) == hf_count == 110_106_428


def test_bert_model_params_are_a_subtree_of_pretraining():
    # A pretraining checkpoint initialises a fine-tuning model by copying encoder and pooler.
    cfg = config_for_size("tiny")
    ids = jax.ShapeDtypeStruct((1, 4), jnp.int32)
    full = jax.eval_shape(BertForPreTraining(cfg).init, jax.random.key(0), ids, ids, ids,
                          jax.ShapeDtypeStruct((1, 2), jnp.int32))["params"]  # fmt: skip
    base = jax.eval_shape(BertModel(cfg).init, jax.random.key(0), ids, ids, ids)["params"]
    assert sorted(full) == ["encoder", "mlm", "nsp", "pooler"]
    assert sorted(base) == ["encoder", "pooler"]
    shapes = lambda tree: jax.tree.map(lambda x: x.shape, nn.unbox(tree))
    assert shapes({k: full[k] for k in base}) == shapes(base)


def _layer_norm(x, scale, bias, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def test_mlm_head_matches_numpy_transcription():
    """Original BERT's get_masked_lm_output: gather, dense+gelu(tanh), LayerNorm, E^T + bias."""
    cfg = BertConfig(vocab_size=11, hidden_size=6, num_layers=1, num_heads=2,
                           intermediate_size=8)  # fmt: skip
    rng = np.random.default_rng(0)
    sequence = rng.normal(size=(2, 5, 6)).astype(np.float32)
    positions = np.array([[0, 4, 4], [3, 1, 0]], np.int32)
    embedding = rng.normal(size=(11, 6)).astype(np.float32)
    head = MaskedLMHead(cfg)
    decoder = lambda h: h @ embedding.T
    params = nn.unbox(
        jax.eval_shape(lambda k: head.init(k, sequence, positions, decoder), jax.random.key(0))
    )
    params = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), params["params"])
    apply = jax.jit(lambda p: head.apply({"params": p}, sequence, positions, decoder))
    got = np.asarray(apply(params))
    gathered = sequence[np.arange(2)[:, None], positions]
    h = gathered @ params["transform"]["kernel"] + params["transform"]["bias"]
    h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
    h = _layer_norm(h, params["layer_norm"]["scale"], params["layer_norm"]["bias"], 1e-12)
    expected = h @ embedding.T + params["output_bias"]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
