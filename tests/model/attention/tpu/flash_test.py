"""The Pallas TPU flash kernel against the XLA path (Pallas interpret mode on CPU; the real TPU
compiler is tests/commands/compile_test.py; natively on a TPU with
``BERTJAX_ATTENTION_TESTS_ON_DEVICE=tpu``: ``cases.interpret``): context and gradients, dropout
included, on every kind of masked row and block layout, packed rows too; an all-masked row
uniform over the keys with no score array kept; and under shard_map on 8 fake devices equal to
the unsharded computation."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from bertjax.model.attention import tpu
from tests.model.attention import cases
from tests.model.attention.cases import Case

FUSED_CASES = [
    Case(128, causal=False, rate=0.1),
    Case(128, causal=False, rate=0.0, tpu_interpret=True, batch=2),
    Case(100, causal=True, rate=0.1),
    Case(200, causal=False, rate=0.0, block=128),
    Case(200, causal=True, rate=0.1, block=128, tpu_interpret=True),
    Case(128, causal=False, rate=0.1, queries=20, head_dim=32),
    Case(200, causal=True, rate=0.1, queries=20, block=128),
    Case(128, causal=False, rate=0.1, dtype="bfloat16"),
    Case(200, causal=True, rate=0.1, dtype="bfloat16", block=128),
    # One key block, two query blocks: the single backward kernel accumulates dk/dv over them.
    Case(256, causal=True, rate=0.1, block=128, block_k=256, tpu_interpret=True),
    Case(230, causal=False, rate=0.1, queries=20, dtype="bfloat16", block=128, block_k=256),
    # Peaked bf16 heads: float32 logits, as the XLA path's (rounded ones would be far off).
    Case(128, causal=True, rate=0.1, dtype="bfloat16", logit_scale=8.0),
    # Packed rows (sequence ids, instances straddling blocks): block-diagonal attention, key
    # block ranges that start past block 0, and dk/dv over the mirrored query block ranges.
    Case(384, causal=False, rate=0.1, block=128, packed=True),
    Case(384, causal=True, rate=0.0, block=128, packed=True, batch=4),
    Case(384, causal=True, rate=0.1, queries=40, block=128, packed=True, tpu_interpret=True),
    Case(384, causal=False, rate=0.0, queries=40, block=128, packed=True, batch=4),
    Case(256, causal=True, rate=0.1, block=128, block_k=256, packed=True, batch=4),
    # Local layers (ModernBERT's window, +-50 or +-64 rows): window edges inside blocks, key
    # ranges that start and end inside the row, composed with packing, gathered queries, bf16.
    Case(512, causal=False, rate=0.1, block=128, window=50),
    Case(512, causal=False, rate=0.0, block=128, window=64, packed=True, batch=4),
    Case(512, causal=False, rate=0.1, queries=40, block=128, window=50, tpu_interpret=True),
    Case(384, causal=False, rate=0.0, block=128, window=64, dtype="bfloat16"),
]


@pytest.mark.parametrize("case", FUSED_CASES, ids=str)
def test_fused_kernel_equals_xla_path(case):
    inputs, positions, cotangent = cases.inputs(case)
    positions = None if positions is None else jnp.asarray(positions)
    interpret = cases.interpret("tpu", pltpu.InterpretParams() if case.tpu_interpret else True)
    block_k = case.block_k or case.block
    fused_fn = cases.kernel_fn(
        tpu.flash_attention, case, block_q=case.block, block_k=block_k, interpret=interpret
    )
    cases.assert_matches_xla(case, fused_fn, inputs, positions, cotangent)


def test_all_masked_row_is_uniform_over_keys_and_saves_no_score_array():
    case = Case(200, causal=True, rate=0.0, block=128)
    (query, key, value, key_mask), _, _ = cases.inputs(case)
    attention_fn = functools.partial(  # no seed: no dropout, whatever the rate
        tpu.flash_attention, causal=True, query_positions=None, dropout_rate=0.1,
        dropout_seed=None, block_q=128, block_k=128, interpret=True,
    )  # fmt: skip
    context = jax.jit(attention_fn)(query, key, value, key_mask)
    # Example 2 has no real key: every query averages all 200 values (padding keys included).
    expected = jnp.broadcast_to(value[2].mean(axis=0), context[2].shape)
    np.testing.assert_allclose(context[2], expected, rtol=1e-5, atol=1e-6)
    # Forward + backward keep nothing of size [B, N, Q, L] (padded) outside the kernels.
    jaxpr = jax.make_jaxpr(
        jax.grad(lambda q, k, v: attention_fn(q, k, v, key_mask).sum(), argnums=(0, 1, 2))
    )(query, key, value)
    padded_keys = case.batch * 256 * case.heads * case.head_dim  # [B, Lp, N*D] = scores / 4
    sizes = [v.aval.size for eqn in jaxpr.eqns for v in eqn.outvars if hasattr(v.aval, "size")]
    assert max(sizes) == padded_keys
