"""What the model does differently for XLA's backends, in one place.

The math never changes: every choice here computes the same function and is tested to agree
with the plain form (tests/model/backend_test.py). Only the shape of the HLO XLA receives does.

* :func:`dense_dot`: on CPU a projection runs as one 2-D GEMM over reshaped operands
  (``[tokens, in] x [in, out]``); XLA:CPU ran BERT's steps with 6-16% less CPU time that way than
  as a ``dot_general`` on the multi-dimensional ``[B, L, N, D]`` / ``[H, N, D]`` forms (the step
  benchmark, docs/benchmarks.md). TPU/GPU keep ``dot_general``, whose layouts their compilers
  handle natively.
* :func:`add_vocab_bias`: the MLM output bias whose gradient is a GEMV rather than XLA:CPU's
  slow column reduction over the ``[B*P, V]`` logit gradient.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def flat_dense_dots() -> bool:
    """Whether projections run as 2-D GEMMs over reshaped operands (on CPU; see module doc)."""
    return jax.default_backend() == "cpu"


def dense_dot(x: jax.Array, kernel: jax.Array, contract_dims: int) -> jax.Array:
    """<dtype>[..., *in] x <dtype>[*in, *out] -> <dtype>[..., *out], contracting ``in``."""
    in_shape = x.shape[x.ndim - contract_dims :]
    out_shape = kernel.shape[contract_dims:]
    if flat_dense_dots():
        batch_shape, contracted = x.shape[: x.ndim - contract_dims], math.prod(in_shape)
        y = jnp.dot(x.reshape(-1, contracted), kernel.reshape(contracted, -1))
        return y.reshape(*batch_shape, *out_shape)
    x_dims = tuple(range(x.ndim - contract_dims, x.ndim))
    return jax.lax.dot_general(x, kernel, ((x_dims, tuple(range(contract_dims))), ((), ())))


@jax.custom_vjp
def add_vocab_bias(logits: jax.Array, bias: jax.Array) -> jax.Array:
    """``logits + bias`` for <float32>[..., V] logits and a <float32>[V] bias.

    Only the gradient differs from ``+``: the bias gradient is taken as a ones-vector matmul
    (a GEMV) instead of XLA:CPU's column reduction over the [B*P, V] logit gradient, which was
    ~0.2 s of a 30522-vocab training step on CPU; same sum, same dtype.
    """
    return logits + bias


def _add_vocab_bias_fwd(logits, bias):
    return logits + bias, jnp.zeros((0,), bias.dtype)


def _add_vocab_bias_bwd(bias_dtype_carrier, grad):
    rows = grad.reshape(-1, grad.shape[-1])
    ones = jnp.ones((rows.shape[0],), rows.dtype)
    return grad, jnp.dot(ones, rows).astype(bias_dtype_carrier.dtype)


add_vocab_bias.defvjp(_add_vocab_bias_fwd, _add_vocab_bias_bwd)
