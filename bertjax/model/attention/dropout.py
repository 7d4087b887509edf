"""Counter-hash dropout: a Bernoulli keep mask that is a pure function of (seed, position).

Used for every dropout of the model, attention probabilities included; the flash attention
kernels (``tpu/``, ``gpu/``) regenerate the same mask tile by tile, so every attention kernel
computes the same function.

Element ``(row, col)`` of a mask is kept when

    mix(mix(row ^ s0) + col * 0x9E3779B9 + s1) >= round(rate * 2**32)

in wrap-around 32-bit arithmetic, for a seed <uint32>[2] = (s0, s1), with ``mix`` the
"lowbias32" integer hash. ``row`` is the flat index of the leading dimensions and ``col`` the
last one, so the mask depends only on global positions: a kernel tile or a shard regenerates
exactly the bits of the whole array from its own indices, and the backward pass recomputes them
instead of storing a mask.

Everything here works on uint32 (the XLA path) and on int32 (inside Pallas TPU kernels, where
Mosaic lowers signed 32-bit integers only): addition, multiplication and xor give the same bits
in both, shifts are logical, and the unsigned comparison is done on sign-flipped values.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

_GOLDEN = 0x9E3779B9  # 2**32 / golden ratio: spreads consecutive columns over the hash input
_MIX_MULTIPLIERS = (0x7FEB352D, 0x846CA68B)  # "lowbias32" (Wellons' hash-prospector)
_SIGN_BIT = 0x80000000


def _const(value: int, dtype) -> jax.Array:
    """The 32-bit pattern ``value`` as a scalar of ``dtype`` (int32 wraps to negative)."""
    return jnp.asarray(np.array(value % 2**32, np.uint32).astype(dtype))


def mix32(x: jax.Array) -> jax.Array:
    """A bijective 32-bit hash with full avalanche, <uint32 or int32>[...] -> same."""
    x = x ^ jax.lax.shift_right_logical(x, _const(16, x.dtype))
    x = x * _const(_MIX_MULTIPLIERS[0], x.dtype)
    x = x ^ jax.lax.shift_right_logical(x, _const(15, x.dtype))
    x = x * _const(_MIX_MULTIPLIERS[1], x.dtype)
    return x ^ jax.lax.shift_right_logical(x, _const(16, x.dtype))


def keep_threshold(rate: float) -> int:
    """The 32-bit threshold below which hash values are dropped (0: no dropout)."""
    return min(int(round(rate * 2**32)), 2**32 - 1)


def keep_scale(rate: float) -> float:
    """Rescale factor of kept elements: the exact inverse of the quantised keep probability."""
    threshold = keep_threshold(rate)
    return 2**32 / (2**32 - threshold)


def keep_mask_tile(seed, rate: float, row_index: jax.Array, col_index: jax.Array) -> jax.Array:
    """<bool> keep mask for broadcastable global indices ``row_index`` and ``col_index``.

    ``seed`` is a pair (s0, s1) of the indices' dtype (uint32 or int32): a <uint32>[2] array,
    or two scalars read from SMEM inside a kernel. The inner hash runs on ``row_index``'s own
    shape (a [rows, 1] column costs one hash per row, not per element). ``rate`` must be > 0.
    """
    dtype = row_index.dtype
    s0, s1 = (jnp.asarray(s).astype(dtype) for s in (seed[0], seed[1]))
    bits = mix32(mix32(row_index ^ s0) + col_index.astype(dtype) * _const(_GOLDEN, dtype) + s1)
    threshold = keep_threshold(rate)
    if dtype == jnp.uint32:
        return bits >= _const(threshold, dtype)
    # Signed compare of sign-flipped values == unsigned compare of the originals.
    flip = _const(_SIGN_BIT, dtype)
    return (bits ^ flip) >= _const(threshold ^ _SIGN_BIT, dtype)


def dropout_keep_mask(seed: jax.Array, rate: float, shape: tuple[int, ...]):
    """Keep mask <bool>[shape] for <uint32>[2] ``seed`` and its rescale factor; (None, 1.0) at
    rate 0. ``row`` is the row-major flat index of all but the last dimension."""
    if keep_threshold(rate) == 0:
        return None, 1.0
    shape = tuple(shape) or (1,)
    rank = len(shape)
    row = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for dim in range(rank - 2, -1, -1):
        index = jax.lax.broadcasted_iota(jnp.uint32, shape, dim)
        row = row + index * jnp.uint32(stride % 2**32)
        stride *= shape[dim]
    col = jax.lax.broadcasted_iota(jnp.uint32, shape, rank - 1)
    return keep_mask_tile(seed, rate, row, col), keep_scale(rate)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def dropout(x: jax.Array, seed: jax.Array, rate: float) -> jax.Array:
    """Inverted dropout of ``x`` <any float>[...] with the mask of :func:`dropout_keep_mask`."""
    keep, scale = dropout_keep_mask(seed, rate, x.shape)
    if keep is None:
        return x
    return jnp.where(keep, x * jnp.asarray(scale, x.dtype), jnp.zeros((), x.dtype))


def _dropout_fwd(x, seed, rate):
    return dropout(x, seed, rate), seed


def _dropout_bwd(rate, seed, grad):
    # The mask is recomputed (a few fused integer ops) instead of saved; the seed gets no
    # gradient (float0 for an integer input).
    return dropout(grad, seed, rate), np.zeros(seed.shape, jax.dtypes.float0)


dropout.defvjp(_dropout_fwd, _dropout_bwd)


class Dropout(nn.Module):
    """Inverted dropout with a counter-hash mask (see :func:`dropout_keep_mask`).

    Same contract as ``nn.Dropout``: uses the ``'dropout'`` rng stream (one key per call, turned
    into a <uint32>[2] seed), no parameters.
    """

    rate: float

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        if deterministic or self.rate == 0.0:
            return x
        seed = jax.random.bits(self.make_rng("dropout"), (2,), jnp.uint32)
        return dropout(x, seed, self.rate)
