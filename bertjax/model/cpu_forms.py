"""The model's forms for XLA:CPU, in one place: the same function as the plain forms, other HLO.

``BertConfig.cpu_forms`` chooses them; ``bertjax.training.sharding.bert_config_for`` sets it
when a step is built for a CPU mesh (never on TPU or GPU, whose compilers handle the plain forms
natively). Tests check each form against the plain one (tests/model/cpu_forms_test.py), and the
step benchmark against the plain forms (docs/benchmarks.md) is why they exist:

* :func:`dense_dot`: a projection as one 2-D GEMM over reshaped operands (``[tokens, in] x [in,
  out]``) instead of a ``dot_general`` on the multi-dimensional ``[B, L, N, D]`` / ``[H, N, D]``
  forms.
* :func:`add_vocab_bias`: the MLM output bias whose gradient is a GEMV rather than XLA:CPU's
  column reduction over the ``[B*P, V]`` logit gradient.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def dense_dot(x: jax.Array, kernel: jax.Array, contract_dims: int, flat: bool) -> jax.Array:
    """<dtype>[..., *in] x <dtype>[*in, *out] -> <dtype>[..., *out], contracting ``in``: as one
    2-D GEMM over reshaped operands when ``flat``, else as a ``dot_general``."""
    in_shape = x.shape[x.ndim - contract_dims :]
    out_shape = kernel.shape[contract_dims:]
    if flat:
        batch_shape, contracted = x.shape[: x.ndim - contract_dims], math.prod(in_shape)
        y = jnp.dot(x.reshape(-1, contracted), kernel.reshape(contracted, -1))
        return y.reshape(*batch_shape, *out_shape)
    x_dims = tuple(range(x.ndim - contract_dims, x.ndim))
    return jax.lax.dot_general(x, kernel, ((x_dims, tuple(range(contract_dims))), ((), ())))


@jax.custom_vjp
def add_vocab_bias(logits: jax.Array, bias: jax.Array) -> jax.Array:
    """``logits + bias`` for <float32>[..., V] logits and a <float32>[V] bias.

    Only the gradient differs from ``+``: the bias gradient is taken as a ones-vector matmul
    (a GEMV) instead of XLA:CPU's column reduction over the [B*P, V] logit gradient; same sum,
    same dtype.
    """
    return logits + bias


def _add_vocab_bias_fwd(logits, bias):
    return logits + bias, jnp.zeros((0,), bias.dtype)


def _add_vocab_bias_bwd(bias_dtype_carrier, grad):
    rows = grad.reshape(-1, grad.shape[-1])
    ones = jnp.ones((rows.shape[0],), rows.dtype)
    return grad, jnp.dot(ones, rows).astype(bias_dtype_carrier.dtype)


add_vocab_bias.defvjp(_add_vocab_bias_fwd, _add_vocab_bias_bwd)
