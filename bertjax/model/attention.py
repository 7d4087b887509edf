"""Scaled dot-product attention behind one function, :func:`attention`.

``impl='xla'`` is the reference: plain XLA ops whose [B, N, Q, L] scores go through memory.
Both implementations compute the same function, attention dropout included: the dropout keep
mask is the counter hash of ``bertjax.model.dropout`` over the global [B, N, Q, L] positions.

Masking: key ``k`` is allowed for query ``q`` of example ``b`` when ``key_mask[b, k]`` is 1 and,
for causal attention, ``k <= query_positions[b, q]``. Masked logits get ``MASK_VALUE`` added (in
float32): finite, so a row with every key masked (a padding-only example) gives the uniform
distribution over the L keys instead of NaN, as the original BERT code does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.model import axes
from bertjax.model.dropout import dropout

MASK_VALUE = -1e9
IMPLS = ("xla",)


def allowed_keys(key_mask: jax.Array, causal: bool, query_positions: jax.Array | None):
    """<int32>[B, L] key mask -> <bool>[B, 1, 1 or Q, L]: which keys each query may attend to."""
    allowed = key_mask[:, None, None, :].astype(bool)
    if causal:
        length = key_mask.shape[1]
        if query_positions is None:
            query_positions = jnp.broadcast_to(jnp.arange(length), key_mask.shape)
        keys = jnp.arange(length)
        allowed = allowed & (keys[None, None, None, :] <= query_positions[:, None, :, None])
    return allowed


def attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    key_mask: jax.Array,
    *,
    causal: bool,
    query_positions: jax.Array | None,
    dropout_rate: float,
    dropout_seed: jax.Array | None,
    impl: str = "xla",
) -> jax.Array:
    """Softmax(query · key) · value with masking and attention dropout.

    Args:
      query: <dtype>[B, Q, N, D], already scaled by 1 / sqrt(D).
      key, value: <dtype>[B, L, N, D].
      key_mask: <int32>[B, L], 1 = a real token.
      causal: the left-to-right ablation's mask (key position <= query position).
      query_positions: <int32>[B, Q], the sequence position of each query (for the causal
        mask), or None when the queries are every position (Q == L).
      dropout_rate: attention dropout rate; applied when ``dropout_seed`` is given.
      dropout_seed: <uint32>[2] or None (no dropout).
      impl: one of ``IMPLS``.

    Returns:
      <dtype>[B, Q, N, D].
    """
    if impl != "xla":
        raise ValueError(f"attention impl {impl!r}: expected one of {IMPLS}")
    return _xla_attention(
        query, key, value, key_mask, causal, query_positions, dropout_rate, dropout_seed
    )


def _xla_attention(query, key, value, key_mask, causal, query_positions, rate, seed):
    dtype = query.dtype
    length_axis = None if query_positions is not None else axes.ACT_LENGTH
    logits = jnp.einsum("bqnd,bknd->bnqk", query, key)  # [B, N, Q, L]
    logits = nn.with_logical_constraint(logits, (axes.ACT_BATCH, axes.ACT_HEADS, length_axis, None))
    bias = jnp.where(allowed_keys(key_mask, causal, query_positions), 0.0, MASK_VALUE)
    # Softmax with the normalisation applied after the value product: dropout and the product
    # are linear in the probabilities, so dividing [B, Q, N, D] by the row sums equals dividing
    # [B, N, Q, L] first, and saves a full pass over the scores (and its backward).
    logits = logits.astype(jnp.float32) + bias.astype(jnp.float32)
    unnormalized = jnp.exp(logits - jax.lax.stop_gradient(logits.max(-1, keepdims=True)))
    row_sums = unnormalized.sum(-1)  # <float32>[B, N, Q]
    unnormalized = unnormalized.astype(dtype)
    if seed is not None and rate > 0.0:
        unnormalized = dropout(unnormalized, seed, rate)
    context = jnp.einsum("bnqk,bknd->bqnd", unnormalized, value)  # [B, Q, N, D]
    inverse = jnp.transpose(1.0 / row_sums, (0, 2, 1))[..., None]  # [B, Q, N, 1]
    return context * inverse.astype(context.dtype)
