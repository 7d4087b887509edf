"""What the model does differently per platform (CPU, GPU, TPU), in one place.

The math never changes: every choice here computes the same function and is tested to agree
with the plain form (tests/model/). Only which kernels run and the shape of the HLO do. The
platform is the one the step is compiled for: :func:`target` sets it around tracing (the step
builders do, from their mesh's devices, so ``python -m bertjax.compile`` on a CPU host traces the
TPU forms); without it, JAX's default backend.

* :func:`attention_kernel`: which attention ``config.model.attention_impl`` runs. ``'auto'``: the
  Pallas flash kernel on TPU (``flash_tpu``); on GPU cuDNN's fused attention when the call has no
  dropout (eval, or a rate of 0) and the dtype is 16-bit, else the Pallas GPU (Triton) flash
  kernel with the same dropout (``flash_gpu``); XLA on CPU. ``'fused'``: the same on TPU and GPU,
  and the Pallas TPU kernel in interpret mode on CPU (for tests). ``'xla'``: XLA everywhere.
* :func:`dense_dot`: on CPU a projection runs as one 2-D GEMM over reshaped operands
  (``[tokens, in] x [in, out]``); XLA:CPU ran BERT's steps with 6-16% less CPU time that way than
  as a ``dot_general`` on the multi-dimensional ``[B, L, N, D]`` / ``[H, N, D]`` forms (the step
  benchmark, docs/benchmarks.md). TPU/GPU keep ``dot_general``, whose layouts their compilers
  handle natively.
* :func:`add_vocab_bias`: the MLM output bias whose gradient is a GEMV rather than XLA:CPU's
  slow column reduction over the ``[B*P, V]`` logit gradient.
"""

from __future__ import annotations

import contextlib
import math
import threading

import jax
import jax.numpy as jnp

_TARGET = threading.local()


@contextlib.contextmanager
def target(platform: str):
    """Traces inside this context build the model for ``platform`` ('cpu', 'gpu' or 'tpu')."""
    previous = getattr(_TARGET, "platform", None)
    _TARGET.platform = platform
    try:
        yield
    finally:
        _TARGET.platform = previous


def platform() -> str:
    """The platform being traced for: :func:`target`'s, else JAX's default backend."""
    return getattr(_TARGET, "platform", None) or jax.default_backend()


def attention_kernel(impl: str, *, dropout: bool, dtype) -> str:
    """'xla' | 'flash_tpu' | 'flash_gpu' | 'cudnn' for ``impl`` 'auto' | 'xla' | 'fused'."""
    where = platform()
    if impl == "xla" or (impl == "auto" and where == "cpu"):
        return "xla"
    if where != "gpu":
        return "flash_tpu"
    if not dropout and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
        return "cudnn"
    return "flash_gpu"


def flat_dense_dots() -> bool:
    """Whether projections run as 2-D GEMMs over reshaped operands (on CPU; see module doc)."""
    return platform() == "cpu"


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
