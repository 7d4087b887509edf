"""Counter-hash dropout: a Bernoulli keep mask that is a pure function of (seed, position).

Used for every dropout of the model, attention probabilities included; the fused attention kernel
(``bertjax.model.fused_attention``) regenerates the same mask tile by tile, so both attention
implementations compute the same function.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn


def _mix32(x: jax.Array) -> jax.Array:
    """A bijective 32-bit integer hash with full avalanche (the "lowbias32" constants)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def dropout_keep_mask(seed: jax.Array, rate: float, shape: tuple[int, ...]):
    """Bernoulli(1 - rate) keep mask <bool>[shape] from a counter hash, and the rescale factor.

    ``seed`` is <uint32>[2] (drawn once per call from the ``'dropout'`` stream). Element
    ``(row, col)`` (``row`` = flat index of the leading dims, ``col`` = last dim) is kept when
    ``mix(mix(row ^ s0) + col * golden + s1) >= rate * 2**32``. Unlike threefry (the dominant
    cost of dropout on CPU, and kept as a mask for the backward pass), this is a few integer
    ops on ``iota`` that XLA fuses into the consumer; :func:`dropout` recomputes it in the
    backward pass, so no mask is ever stored. The keep probability is quantised to 2**-32 and
    the rescale uses the exact quantised value, so ``E[mask * scale] == 1``. The mask depends
    on global positions only, so it is the same however the array is sharded.
    """
    threshold = min(int(round(rate * 2**32)), 2**32 - 1)
    if threshold == 0:
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
    bits = _mix32(_mix32(row ^ seed[0]) + col * jnp.uint32(0x9E3779B9) + seed[1])
    return bits >= jnp.uint32(threshold), 2**32 / (2**32 - threshold)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def dropout(x: jax.Array, seed: jax.Array, rate: float) -> jax.Array:
    """Inverted dropout of ``x`` with the mask of :func:`dropout_keep_mask`(seed, rate)."""
    keep, scale = dropout_keep_mask(seed, rate, x.shape)
    if keep is None:
        return x
    return jnp.where(keep, x * jnp.asarray(scale, x.dtype), jnp.zeros((), x.dtype))


def _dropout_fwd(x, seed, rate):
    return dropout(x, seed, rate), seed


def _dropout_bwd(rate, seed, grad):
    # The mask is recomputed (fused, a few integer ops) instead of saved; the seed gets no
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
