"""Counter-hash dropout against its definition: Bernoulli(1 - rate) and unbiased, independent
across positions and seeds, and the backward pass uses the forward mask."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.model.dropout import Dropout, dropout, dropout_keep_mask


def _seed(i: int) -> jax.Array:
    return jax.random.bits(jax.random.key(i), (2,), jnp.uint32)


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_dropout_mask_is_bernoulli_and_unbiased(rate):
    """Keep fraction within 5 sigma of a Binomial(n, 1 - rate) reference; E[out] = x exactly
    in expectation (scale uses the quantised keep probability); no correlation between
    neighbours along any axis, nor between two seeds; odd shapes work."""
    shape, n = (64, 128, 129), 64 * 128 * 129
    keep, scale = dropout_keep_mask(_seed(3), rate, shape)
    k = np.asarray(keep, np.float64)
    sigma = np.sqrt(rate * (1 - rate) / n)
    assert abs(k.mean() - (1 - rate)) < 5 * sigma
    threshold = round(rate * 2**32)
    assert scale == pytest.approx(2**32 / (2**32 - threshold), rel=1e-12)
    # Pearson correlations of independent Bernoullis over ~1M pairs: |r| < 5/sqrt(n) ~ 0.005.
    other = np.asarray(dropout_keep_mask(_seed(4), rate, shape)[0], np.float64)
    pairs = [
        (k[..., :-1], k[..., 1:]),  # next column
        (k[:, :-1], k[:, 1:]),  # next row
        (k[:-1], k[1:]),  # next leading index
        (k, other),  # another seed
    ]
    for a, b in pairs:
        assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 5 / np.sqrt(a.size)
    # Every row gets its own pattern (a row-only hash would repeat columns across rows).
    assert len({row.tobytes() for row in np.asarray(keep).reshape(-1, 129)[:4096]}) == 4096
    x = jnp.ones((256, 257))
    y = Dropout(rate).apply({}, x, False, rngs={"dropout": jax.random.key(4)})
    values = np.unique(np.asarray(y))
    assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(scale, rel=1e-6)
    assert Dropout(rate).apply({}, x, True) is x


def test_dropout_gradient_uses_the_forward_mask():
    """d/dx sum(c * dropout(x)) = c * mask * scale, with the mask of the forward pass."""
    x = jax.random.normal(jax.random.key(0), (8, 33, 17))
    c = jax.random.normal(jax.random.key(1), x.shape)
    seed = _seed(5)
    y = dropout(x, seed, 0.3)
    grad = jax.jit(jax.grad(lambda x: jnp.sum(c * dropout(x, seed, 0.3))))(x)
    keep = np.asarray(y) != 0
    scale = dropout_keep_mask(seed, 0.3, x.shape)[1]
    np.testing.assert_allclose(grad, np.where(keep, np.asarray(c) * scale, 0.0), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(y)[keep], np.asarray(x)[keep] * scale, rtol=1e-6)
