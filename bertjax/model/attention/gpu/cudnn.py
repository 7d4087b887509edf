"""cuDNN's fused attention (``jax.nn.dot_product_attention``) for GPU calls without dropout.

cuDNN has no counter-hash dropout and runs 16-bit inputs only, so the 'gpu' kernel family runs
it for those calls (evaluation, a rate of 0) and the Pallas kernels of ``flash.py`` for the rest.
The mask travels as the XLA path's additive bias <dtype>[B, 1, Q, L] (per query: sequence ids
make it block-diagonal in a packed row), so a row whose keys are all masked stays uniform. cuDNN
reads it whole; it does not skip a packed row's other instances the way the flash kernels do.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bertjax.model.attention.common import MASK_VALUE
from bertjax.model.attention.xla import allowed_keys


def runs(dropout: bool, dtype) -> bool:
    """Whether cuDNN can run a call: no dropout, 16-bit inputs."""
    return not dropout and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)


def cudnn_attention(
    query, key, value, key_mask, causal, query_positions, implementation="cudnn", window=None
):
    """Shapes as ``bertjax.model.attention.attention``, no dropout. ``implementation='xla'``
    runs JAX's own XLA form of the same call (the tests check this wrapper on CPU with it).
    A ``window`` is in the bias, like every other mask: cuDNN computes its tiles all the same."""
    allowed = allowed_keys(key_mask, causal, query_positions, window)
    bias = jnp.where(allowed, 0.0, MASK_VALUE)
    return jax.nn.dot_product_attention(
        query,
        key,
        value,
        bias=bias.astype(query.dtype),
        scale=1.0,
        implementation=implementation,
    )
