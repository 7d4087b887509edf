"""The rule the kernels' equality tests hold a kernel to on a device (``cases.assert_matches_xla``
with ``native=True``: both paths against the float32 truth at the highest matmul precision),
tried on CPU with the TPU kernel in interpret mode: it passes the kernel and fails one scaled by
1.001 (float32) or 1.02 (bfloat16)."""

import jax.numpy as jnp
import pytest

from tests.model.attention import cases
from tests.model.attention.cases import Case

CASE = Case(128, causal=False, rate=0.1)


def _scaled(attention_fn, factor):
    return lambda *args: attention_fn(*args) * factor


@pytest.mark.parametrize("native", [False, True])
def test_the_kernel_passes_in_both_modes(native):
    inputs, positions, cotangent = cases.inputs(CASE)
    kernel = cases.dispatch(CASE, "tpu_interpret")
    cases.assert_matches_xla(CASE, kernel, inputs, positions, cotangent, native=native)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_device_rule_fails_a_slightly_scaled_kernel(dtype):
    case = CASE._replace(dtype=dtype, rate=0.0)
    inputs, positions, cotangent = cases.inputs(case)
    off = _scaled(
        cases.dispatch(case, "tpu_interpret"),
        jnp.asarray(1.001 if dtype == "float32" else 1.02, dtype),
    )
    with pytest.raises(AssertionError, match="from the truth, allowed"):
        cases.assert_matches_xla(case, off, inputs, positions, cotangent, native=True)
