"""The XLA path against the model's original attention code (copied below, with the one change
made since: float32 logits, the product never rounded to the compute dtype): the same context
and gradients, bit for bit, dropout and gathered query positions included; and in bfloat16 the
float32 logits are what brings it closer to the float32 truth than the original's. With sequence
ids (packed rows), each instance gets exactly what it gets alone in its own row."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.model.attention import dropout as dropout_lib
from tests.model.attention import cases
from tests.model.attention.cases import Case


def _original_attention_bias(input_mask, causal):
    """The model's attention_bias before bertjax.model.attention: <float32>[B, 1, 1 or L, L]."""
    allowed = input_mask[:, None, None, :].astype(bool)
    if causal:
        length = input_mask.shape[1]
        allowed = allowed & jnp.tril(jnp.ones((length, length), bool))[None, None]
    return jnp.where(allowed, 0.0, -1e9).astype(jnp.float32)


def _model_attention(
    query, key, value, input_mask, causal, query_positions, rate, seed, float32_logits=True
):
    """SelfAttention.__call__'s math as it was before bertjax.model.attention, from the scaled
    query on; dropout as its Dropout module applies it for a drawn seed. ``float32_logits``:
    the product kept in float32 (else rounded to the compute dtype, as the original did)."""
    attention_bias = _original_attention_bias(input_mask, causal=causal)
    if query_positions is not None and attention_bias.shape[2] != 1:
        attention_bias = jnp.take_along_axis(
            attention_bias, query_positions[:, None, :, None], axis=2
        )
    logits = jnp.einsum(  # [B, N, Q, L]
        "bqnd,bknd->bnqk",
        query,
        key,
        preferred_element_type=jnp.float32 if float32_logits else None,
    )
    logits = logits.astype(jnp.float32) + attention_bias
    unnormalized = jnp.exp(logits - jax.lax.stop_gradient(logits.max(-1, keepdims=True)))
    row_sums = unnormalized.sum(-1)  # <float32>[B, N, Q]
    unnormalized = unnormalized.astype(query.dtype)
    if seed is not None:
        unnormalized = dropout_lib.dropout(unnormalized, seed, rate)
    context = jnp.einsum("bnqk,bknd->bqnd", unnormalized, value)  # [B, Q, N, D]
    inverse = jnp.transpose(1.0 / row_sums, (0, 2, 1))[..., None]  # [B, Q, N, 1]
    return context * inverse.astype(context.dtype)


XLA_CASES = [
    Case(128, causal=False, rate=0.1),
    Case(100, causal=True, rate=0.1, dtype="bfloat16"),
    Case(128, causal=True, rate=0.1, queries=20),
    Case(128, causal=False, rate=0.0, queries=20, dtype="bfloat16"),
]


@pytest.mark.parametrize("case", XLA_CASES, ids=str)
def test_xla_path_is_bit_identical_to_the_model_code(case):
    inputs, positions, cotangent = cases.inputs(case)
    positions = None if positions is None else jnp.asarray(positions)

    def reference(query, key, value, key_mask, positions, seed):
        return _model_attention(
            query, key, value, key_mask, case.causal, positions, case.rate, seed
        )

    seed = cases.seed(case)
    expected = cases.value_and_grads(reference, inputs, positions, cotangent, seed)
    actual = cases.value_and_grads(cases.dispatch(case), inputs, positions, cotangent, seed)
    for got, want in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_bfloat16_float32_logits_are_closer_to_the_float32_truth_than_rounded_ones():
    """The logits' rounding was the largest error of a bf16 attention before: against the
    float32 computation on the same inputs, the XLA path's context is closer than the original
    code's, which rounded the logits to bfloat16 before the softmax."""
    case = Case(128, causal=False, rate=0.0, dtype="bfloat16", logit_scale=8.0)
    (query, key, value, key_mask), _, _ = cases.inputs(case)
    upcast = [x.astype(jnp.float32) for x in (query, key, value)]
    truth = _model_attention(*upcast, key_mask, False, None, 0.0, None)
    got = cases.dispatch(case)(query, key, value, key_mask, None, None)
    rounded = _model_attention(
        query, key, value, key_mask, False, None, 0.0, None, float32_logits=False
    )
    error = lambda x: float(jnp.abs(x.astype(jnp.float32) - truth).max())
    assert error(got) < 0.5 * error(rounded), (error(got), error(rounded))


@pytest.mark.parametrize("causal", [False, True])
def test_packed_instances_get_exactly_what_they_get_alone(causal):
    """Without cross-contamination: with dropout off, each instance of a packed row (sequence
    ids; examples 0 and 3 of ``cases.packed_key_mask``) gets the context and the q, k, v
    gradients it gets moved alone to row position 0 of its own row, padded. The cotangent is
    zero on padding queries (they see every real key, in both rows)."""
    case = Case(160, causal=causal, rate=0.0, batch=4, packed=True)
    (query, key, value, key_mask), _, cotangent = cases.inputs(case)
    cotangent = cotangent * (key_mask > 0)[:, :, None, None]
    packed = cases.value_and_grads(
        cases.dispatch(case), (query, key, value, key_mask), None, cotangent, None
    )
    instances = [(b, int(i)) for b in (0, 3) for i in np.unique(key_mask[b]) if i > 0]
    assert len(instances) == 8
    alone_inputs, spans = [], []
    for b, instance in instances:
        where = np.nonzero(np.asarray(key_mask[b]) == instance)[0]
        start, size = int(where[0]), len(where)
        spans.append((b, start, size))
        alone_inputs.append(
            [
                jnp.zeros_like(x[b]).at[:size].set(x[b, start : start + size])
                for x in (query, key, value, cotangent)
            ]
        )
    stacked = [jnp.stack(arrays) for arrays in zip(*alone_inputs, strict=True)]
    alone_mask = jnp.asarray(
        [np.arange(case.length) < size for _, _, size in spans], jnp.int32
    )  # unpacked rows: 1s then 0s
    alone = cases.value_and_grads(
        cases.dispatch(case), (*stacked[:3], alone_mask), None, stacked[3], None
    )
    for row, (b, start, size) in enumerate(spans):
        for got, want in zip(jax.tree.leaves(packed), jax.tree.leaves(alone), strict=True):
            scale = float(jnp.abs(want).max())
            np.testing.assert_allclose(
                got[b, start : start + size], want[row, :size], rtol=1e-5, atol=1e-6 * scale
            )
