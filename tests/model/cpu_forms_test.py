"""The CPU forms compute the plain function: the 2-D GEMM form of a projection
equals ``dot_general`` (and an einsum reference), the vocab bias's GEMV gradient equals ``+``'s."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.model import cpu_forms


@pytest.mark.parametrize("flat", [True, False])
@pytest.mark.parametrize(
    "x_shape,kernel_shape,equation",
    [
        ((2, 5, 8), (8, 3, 4), "blh,hnd->blnd"),  # query/key/value: [B, L, H] x [H, N, D]
        ((2, 5, 3, 4), (3, 4, 8), "blnd,ndh->blh"),  # attention output: contract 2 dims
        ((2, 5, 8), (8, 12), "blh,hf->blf"),  # FFN
    ],
)
def test_dense_dot_forms_equal_an_einsum(flat, x_shape, kernel_shape, equation):
    x = jax.random.normal(jax.random.key(0), x_shape)
    kernel = jax.random.normal(jax.random.key(1), kernel_shape)
    contract = 2 if len(x_shape) == 4 else 1
    got = jax.jit(lambda x, k: cpu_forms.dense_dot(x, k, contract, flat))(x, kernel)
    want = np.einsum(equation, np.asarray(x, np.float64), np.asarray(kernel, np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_add_vocab_bias_gradient_matches_plain_add():
    logits = jax.random.normal(jax.random.key(0), (3, 5, 7))
    bias = jax.random.normal(jax.random.key(1), (7,))
    weights = jax.random.normal(jax.random.key(2), (3, 5, 7))
    loss = lambda add: lambda lg, b: jnp.sum(jnp.tanh(add(lg, b)) * weights)
    want = jax.grad(loss(jnp.add), argnums=(0, 1))(logits, bias)
    got = jax.grad(loss(cpu_forms.add_vocab_bias), argnums=(0, 1))(logits, bias)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
