"""The XLA path against the model's original attention code (copied below): the same context
and gradients, bit for bit, dropout and gathered query positions included."""

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


def _model_attention(query, key, value, input_mask, causal, query_positions, rate, seed):
    """SelfAttention.__call__'s math as it was before bertjax.model.attention, from the scaled
    query on; dropout as its Dropout module applies it for a drawn seed."""
    attention_bias = _original_attention_bias(input_mask, causal=causal)
    if query_positions is not None and attention_bias.shape[2] != 1:
        attention_bias = jnp.take_along_axis(
            attention_bias, query_positions[:, None, :, None], axis=2
        )
    logits = jnp.einsum("bqnd,bknd->bnqk", query, key)  # [B, N, Q, L]
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
