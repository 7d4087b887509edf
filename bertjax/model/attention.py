"""Scaled dot-product attention behind one function, :func:`attention`, dropout included.

Per example b, head n, query q and key k (the query already scaled by 1 / sqrt(D)):

    logits = float32(dtype(query . key)) + bias     bias: 0 allowed, MASK_VALUE masked
    u = exp(logits - stop_gradient(max_k logits)),  row_sum = sum_k u
    context = (sum_k dropout(dtype(u)) value) / row_sum

Key ``k`` is allowed for query ``q`` when ``key_mask[b, k]`` is 1 and, for causal attention,
``k <= query_positions[b, q]``. ``MASK_VALUE`` is finite, so a row whose keys are all masked (a
padding-only example) is uniform over the L keys instead of NaN. Dropout is the counter hash of
``bertjax.model.dropout`` over the global [B, N, Q, L] positions.

Implementations (``backend.attention_kernel`` picks one from ``config.model.attention_impl``):

* ``xla``: the formula above as XLA ops; the [B, N, Q, L] scores go through memory.
* ``flash_tpu``: the Pallas kernel of ``flash_tpu.py``: the same function, dropout included,
  without ever writing the scores; under a mesh it runs per (batch, heads) shard with the mesh
  axes of the logical rules for ``act_batch`` and ``act_heads``.
* ``flash_gpu``: the Pallas GPU (Triton) kernels of ``flash_gpu.py``: the same function,
  dropout included, for GPU calls cuDNN cannot run (dropout, float32); sharded the same way.
* ``cudnn``: ``jax.nn.dot_product_attention`` with cuDNN on GPU, for calls without dropout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.model import axes, backend, flash_gpu, flash_tpu
from bertjax.model.dropout import dropout

MASK_VALUE = -1e9


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
    impl: str = "auto",
) -> jax.Array:
    """Softmax(query · key) · value with masking and attention dropout (module docstring).

    Args:
      query: <dtype>[B, Q, N, D], already scaled by 1 / sqrt(D).
      key, value: <dtype>[B, L, N, D].
      key_mask: <int32>[B, L], 1 = a real token.
      causal: the left-to-right ablation's mask (key position <= query position).
      query_positions: <int32>[B, Q], the sequence position of each query (for the causal
        mask), or None when the queries are every position (Q == L).
      dropout_rate: attention dropout rate; applied when ``dropout_seed`` is given.
      dropout_seed: <uint32>[2] or None (no dropout).
      impl: ``config.model.attention_impl``: 'auto' | 'xla' | 'fused'.

    Returns:
      <dtype>[B, Q, N, D].
    """
    if query_positions is None and query.shape[1] != key.shape[1]:
        raise ValueError(f"{query.shape[1]} queries need query_positions for {key.shape[1]} keys")
    if dropout_rate <= 0.0:
        dropout_seed = None
    kernel = backend.attention_kernel(impl, dropout=dropout_seed is not None, dtype=query.dtype)
    args = (query, key, value, key_mask)
    if kernel == "cudnn":
        return _dot_product_attention(*args, causal, query_positions, implementation="cudnn")
    if kernel == "xla":
        return _xla_attention(*args, causal, query_positions, dropout_rate, dropout_seed)
    options = dict(
        causal=causal,
        query_positions=query_positions,
        dropout_rate=dropout_rate,
        dropout_seed=dropout_seed,
    )
    fused = flash_tpu if kernel == "flash_tpu" else flash_gpu
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return fused.flash_attention(*args, **options)
    batch_axes, head_axes = (
        () if names is None else (names,) if isinstance(names, str) else tuple(names)
        for names in nn.logical_to_mesh_axes((axes.ACT_BATCH, axes.ACT_HEADS))
    )
    return fused.flash_attention(
        *args, mesh=mesh, batch_axes=batch_axes, head_axes=head_axes, **options
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
    if seed is not None:
        unnormalized = dropout(unnormalized, seed, rate)
    context = jnp.einsum("bnqk,bknd->bqnd", unnormalized, value)  # [B, Q, N, D]
    inverse = jnp.transpose(1.0 / row_sums, (0, 2, 1))[..., None]  # [B, Q, N, 1]
    return context * inverse.astype(context.dtype)


def _dot_product_attention(query, key, value, key_mask, causal, query_positions, implementation):
    """JAX's fused attention (``implementation='cudnn'`` on GPU; 'xla' lets tests check this
    wrapper on CPU). The mask travels as the same additive bias, so masked rows stay uniform."""
    bias = jnp.where(allowed_keys(key_mask, causal, query_positions), 0.0, MASK_VALUE)
    return jax.nn.dot_product_attention(
        query,
        key,
        value,
        bias=bias.astype(query.dtype),
        scale=1.0,
        implementation=implementation,
    )
