"""Rotary position embeddings (Su et al., 2021) in the non-interleaved form HF ModernBERT uses.

For a head vector x of even dimension D split into halves (x1, x2), and the angles
``position * theta ** (-2i / D)`` for i < D / 2, repeated for both halves (cos, sin):

    rotate(x) = x * cos + concat(-x2, x1) * sin       (HF's ``rotate_half`` form)

The angles are computed in float32 from each token's **position id**, so a packed row's
instances, whose ids restart at 0, are rotated exactly as each would be alone. (RoPE scores
depend only on the distance between query and key, and a packed row's instances never attend to
each other, so row indices would give the same scores up to rounding; the ids give HF's rounding.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def angles(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """<int32>[B, L] position ids -> (cos, sin), each <float32>[B, L, 1, D]."""
    exponents = jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim
    inverse_frequencies = 1.0 / (jnp.float32(theta) ** exponents)  # [D / 2]
    freqs = positions.astype(jnp.float32)[..., None] * inverse_frequencies  # [B, L, D / 2]
    both = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
    return jnp.cos(both), jnp.sin(both)


def rotate(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """<dtype>[B, L, N, D] heads, <int32>[B, L] position ids -> the rotated heads, <dtype>."""
    cos, sin = angles(positions, x.shape[-1], theta)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos.astype(x.dtype) + rotated * sin.astype(x.dtype)
