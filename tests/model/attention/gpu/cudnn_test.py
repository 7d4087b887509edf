"""The cuDNN wrapper (bias, scale 1, layout) against the XLA path, run through
jax.nn.dot_product_attention's own XLA implementation on CPU, and which calls cuDNN can take."""

import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.model.attention.gpu import cudnn
from tests.model.attention import cases
from tests.model.attention.cases import Case


@pytest.mark.parametrize(
    "case",
    [
        Case(100, causal=True, rate=0.0, queries=20),
        Case(64, False, 0.0),
        Case(100, causal=False, rate=0.0, batch=4, packed=True),  # a [B, 1, Q, L] bias
        Case(100, causal=True, rate=0.0, queries=20, batch=4, packed=True),
    ],
)
def test_cudnn_wrapper_computes_the_xla_path(case):
    """The same context, an all-padding example's uniform rows and packed rows included."""
    inputs, positions, _ = cases.inputs(case)
    positions = None if positions is None else jnp.asarray(positions)
    got = cudnn.cudnn_attention(*inputs, case.causal, positions, implementation="xla")
    want = cases.dispatch(case)(*inputs, positions, None)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_cudnn_takes_16_bit_calls_without_dropout_only():
    assert cudnn.runs(False, jnp.bfloat16) and cudnn.runs(False, jnp.float16)
    assert not cudnn.runs(True, jnp.bfloat16) and not cudnn.runs(False, jnp.float32)
