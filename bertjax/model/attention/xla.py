"""The attention as XLA ops: the reference every kernel computes exactly (the package docstring
gives the function). The [B, N, Q, L] scores go through memory; on CPU it is what runs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.model import axes
from bertjax.model.attention.common import MASK_VALUE
from bertjax.model.attention.dropout import dropout


def query_ids(key_mask: jax.Array, query_positions: jax.Array | None) -> jax.Array:
    """<int32>[B, Q]: each query's sequence id (the key mask's entry at its position)."""
    if query_positions is None:
        return key_mask
    return jnp.take_along_axis(key_mask, query_positions, axis=1)


def allowed_keys(
    key_mask: jax.Array, causal: bool, query_positions: jax.Array | None, window: int | None = None
):
    """<int32>[B, L] key mask (sequence ids) -> <bool>[B, 1, 1 or Q, L]: which keys each query
    may attend to (the package docstring's rule)."""
    keys = key_mask[:, None, None, :]
    queries = query_ids(key_mask, query_positions)[:, None, :, None]
    allowed = (keys > 0) & ((keys == queries) | (queries <= 0))
    if causal or window is not None:
        length = key_mask.shape[1]
        if query_positions is None:
            query_positions = jnp.broadcast_to(jnp.arange(length), key_mask.shape)
        index = jnp.arange(length)[None, None, None, :]
        rows = query_positions[:, None, :, None]
        if causal:
            allowed = allowed & (index <= rows)
        if window is not None:
            allowed = allowed & (jnp.abs(index - rows) <= window)
    return allowed


def xla_attention(query, key, value, key_mask, causal, query_positions, rate, seed, window=None):
    """Shapes and arguments as ``bertjax.model.attention.attention``; ``seed`` None: no dropout."""
    dtype = query.dtype
    length_axis = None if query_positions is not None else axes.ACT_LENGTH
    # Float32 logits straight from the product (the matrix units accumulate in float32): the
    # softmax sees them unrounded, whatever the compute dtype.
    logits = jnp.einsum("bqnd,bknd->bnqk", query, key, preferred_element_type=jnp.float32)
    logits = nn.with_logical_constraint(logits, (axes.ACT_BATCH, axes.ACT_HEADS, length_axis, None))
    bias = jnp.where(allowed_keys(key_mask, causal, query_positions, window), 0.0, MASK_VALUE)
    # Softmax with the normalisation applied after the value product: dropout and the product
    # are linear in the probabilities, so dividing [B, Q, N, D] by the row sums equals dividing
    # [B, N, Q, L] first, and saves a full pass over the scores (and its backward).
    logits = logits + bias.astype(jnp.float32)  # <float32>[B, N, Q, L]
    unnormalized = jnp.exp(logits - jax.lax.stop_gradient(logits.max(-1, keepdims=True)))
    row_sums = unnormalized.sum(-1)  # <float32>[B, N, Q]
    unnormalized = unnormalized.astype(dtype)
    if seed is not None:
        unnormalized = dropout(unnormalized, seed, rate)
    context = jnp.einsum("bnqk,bknd->bqnd", unnormalized, value)  # [B, Q, N, D]
    inverse = jnp.transpose(1.0 / row_sums, (0, 2, 1))[..., None]  # [B, Q, N, 1]
    return context * inverse.astype(context.dtype)
