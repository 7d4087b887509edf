"""Counter-hash dropout against its definition: a numpy transcription of the hash (uint32 and the
kernels' int32), Bernoulli(1 - rate) and unbiased, independent across positions and seeds, and
the backward pass uses the forward mask."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.model.attention import dropout as dropout_lib
from bertjax.model.attention.dropout import Dropout, dropout, dropout_keep_mask

SEED = np.array([0x12345678, 0x9ABCDEF0], np.uint32)


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


def _numpy_mix32(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def test_hash_mask_is_its_definition_in_uint32_and_int32():
    """The mask of (b, n, q, k) is mix(mix(row ^ s0) + k * golden + s1) >= threshold, row the
    flat index of (b, n, q): transcribed in numpy uint32 (wrap-around) arithmetic."""
    shape = (2, 3, 5, 130)
    keep, scale = dropout_lib.dropout_keep_mask(jnp.asarray(SEED), 0.1, shape)
    row = np.arange(np.prod(shape[:-1]), dtype=np.uint32).reshape(*shape[:-1], 1)
    col = np.arange(shape[-1], dtype=np.uint32)
    with np.errstate(over="ignore"):
        bits = _numpy_mix32(_numpy_mix32(row ^ SEED[0]) + col * np.uint32(0x9E3779B9) + SEED[1])
    threshold = round(0.1 * 2**32)
    np.testing.assert_array_equal(keep, bits >= np.uint32(threshold))
    assert scale == 2**32 / (2**32 - threshold)
    # The kernel's int32 arithmetic on the same bit patterns, rows and columns past 2**31.
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 2**32, (64, 1), dtype=np.uint32)
    cols = rng.integers(0, 2**32, (1, 64), dtype=np.uint32)
    unsigned = dropout_lib.keep_mask_tile(jnp.asarray(SEED), 0.3, jnp.asarray(rows), cols)
    as_int32 = lambda x: jnp.asarray(x.view(np.int32))
    signed = dropout_lib.keep_mask_tile(as_int32(SEED), 0.3, as_int32(rows), as_int32(cols))
    np.testing.assert_array_equal(unsigned, signed)
