"""Attention against references: the model's original attention code (copied below), the XLA
path (for the Pallas TPU and GPU flash kernels, run in interpret mode on CPU, and for the cuDNN
wrapper, run through JAX's own XLA implementation), a numpy transcription of the dropout hash,
definitions (an all-masked row is uniform over the keys), the unsharded computation (for the
kernels under shard_map on 8 fake devices, called directly and through the model's dispatch),
and JAX's Triton lowering (the GPU kernels lower for 'cuda' on this CPU-only machine)."""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from bertjax.model import attention, backend, flash_gpu, flash_tpu
from bertjax.model import dropout as dropout_lib
from bertjax.training import sharding

SEED = np.array([0x12345678, 0x9ABCDEF0], np.uint32)


def _original_attention_bias(input_mask, causal):
    """The model's attention_bias before bertjax.model.attention: <float32>[B, 1, 1 or L, L]."""
    allowed = input_mask[:, None, None, :].astype(bool)
    if causal:
        length = input_mask.shape[1]
        allowed = allowed & jnp.tril(jnp.ones((length, length), bool))[None, None]
    return jnp.where(allowed, 0.0, -1e9).astype(jnp.float32)


def _model_attention(query, key, value, input_mask, causal, query_positions, rate, seed):
    """SelfAttention.__call__'s math as it was before bertjax.model.attention, from the scaled
    query on; dropout as its Dropout module applies it for a drawn seed."""
    attention_bias = _original_attention_bias(input_mask, causal=causal)
    if query_positions is not None and attention_bias.shape[2] != 1:
        attention_bias = jnp.take_along_axis(
            attention_bias, query_positions[:, None, :, None], axis=2
        )
    logits = jnp.einsum("bqnd,bknd->bnqk", query, key)  # [B, N, Q, L]
    logits = logits.astype(jnp.float32) + attention_bias
    unnormalized = jnp.exp(logits - jax.lax.stop_gradient(logits.max(-1, keepdims=True)))
    row_sums = unnormalized.sum(-1)  # <float32>[B, N, Q]
    unnormalized = unnormalized.astype(query.dtype)
    if seed is not None:
        unnormalized = dropout_lib.dropout(unnormalized, seed, rate)
    context = jnp.einsum("bnqk,bknd->bqnd", unnormalized, value)  # [B, Q, N, D]
    inverse = jnp.transpose(1.0 / row_sums, (0, 2, 1))[..., None]  # [B, Q, N, 1]
    return context * inverse.astype(context.dtype)


class Case(NamedTuple):
    length: int
    causal: bool
    rate: float
    queries: int | None = None  # None: every position; else that many query_positions
    dtype: str = "float32"
    block: int | None = None  # block_q = block_k; None: the defaults
    block_k: int | None = None  # else block_k, when it differs
    tpu_interpret: bool = False  # TPU interpret mode (NaN for uninitialised memory, DMAs)
    batch: int = 3
    heads: int = 2
    head_dim: int = 64
    shuffled: bool = False  # query positions in random order, the last quarter padded with 0


def _inputs(case: Case, seed=0):
    """Random q (scaled), k, v <dtype>[B, T, N, D], a cotangent, key mask with example 0 real,
    1 and 3 partly padding, 2 all padding, and sorted distinct query positions (or None)."""
    rng = np.random.default_rng(seed)
    b, n, d, length = case.batch, case.heads, case.head_dim, case.length
    queries = case.queries or length
    shape = lambda t: (b, t, n, d)
    query = rng.normal(size=shape(queries)) * 2 / np.sqrt(d)
    key, value = rng.normal(size=shape(length)), rng.normal(size=shape(length))
    cotangent = rng.normal(size=shape(queries)).astype(np.float32)
    real = [length, min(90, length - 7), 0, length // 2][:b]
    key_mask = (np.arange(length)[None] < np.array(real)[:, None]).astype(np.int32)
    positions = None
    if case.queries:
        positions = np.sort(
            np.stack([rng.choice(length, queries, replace=False) for _ in range(b)]), axis=1
        ).astype(np.int32)
        if case.shuffled:  # query blocks then need key blocks in no monotone order
            positions = rng.permuted(positions, axis=1)
            positions[:, -queries // 4 :] = 0
    dtype = jnp.dtype(case.dtype)
    arrays = [jnp.asarray(x, dtype) for x in (query, key, value)]
    return (*arrays, jnp.asarray(key_mask)), positions, jnp.asarray(cotangent)


def _value_and_grads(attention_fn, inputs, positions, cotangent, seed):
    """(context, (dq, dk, dv)) of sum(context * cotangent), jitted."""
    query, key, value, key_mask = inputs

    def loss(query, key, value):
        context = attention_fn(query, key, value, key_mask, positions, seed)
        return jnp.sum(context.astype(jnp.float32) * cotangent), context

    grads, context = jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(query, key, value)
    return context, grads


FLASH = {"flash": flash_tpu, "flash_gpu": flash_gpu}


def _impl(impl, case: Case, **options):
    """'xla' through attention.attention, 'flash' / 'flash_gpu' the TPU / GPU kernel itself
    (``options``: blocks, interpret)."""

    def attention_fn(query, key, value, key_mask, positions, seed):
        kwargs = dict(
            causal=case.causal, query_positions=positions, dropout_rate=case.rate,
            dropout_seed=seed,
        )  # fmt: skip
        if impl in FLASH:
            return FLASH[impl].flash_attention(query, key, value, key_mask, **kwargs, **options)
        return attention.attention(query, key, value, key_mask, impl=impl, **kwargs)

    return attention_fn


def _seed(case: Case):
    return jnp.asarray(SEED) if case.rate else None


XLA_CASES = [
    Case(128, causal=False, rate=0.1),
    Case(100, causal=True, rate=0.1, dtype="bfloat16"),
    Case(128, causal=True, rate=0.1, queries=20),
    Case(128, causal=False, rate=0.0, queries=20, dtype="bfloat16"),
]


@pytest.mark.parametrize("case", XLA_CASES, ids=str)
def test_xla_path_is_bit_identical_to_the_model_code(case):
    inputs, positions, cotangent = _inputs(case)
    positions = None if positions is None else jnp.asarray(positions)

    def reference(query, key, value, key_mask, positions, seed):
        return _model_attention(
            query, key, value, key_mask, case.causal, positions, case.rate, seed
        )

    expected = _value_and_grads(reference, inputs, positions, cotangent, _seed(case))
    actual = _value_and_grads(_impl("xla", case), inputs, positions, cotangent, _seed(case))
    for got, want in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


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
]


@pytest.mark.parametrize("case", FUSED_CASES, ids=str)
def test_fused_kernel_equals_xla_path(case):
    inputs, positions, cotangent = _inputs(case)
    positions = None if positions is None else jnp.asarray(positions)
    interpret = pltpu.InterpretParams() if case.tpu_interpret else True
    block_k = case.block_k or case.block
    fused_fn = _impl("flash", case, block_q=case.block, block_k=block_k, interpret=interpret)
    _assert_matches_xla(case, fused_fn, inputs, positions, cotangent)


GPU_CASES = [
    Case(128, causal=False, rate=0.1),
    Case(100, causal=True, rate=0.1, block=32),
    Case(200, causal=True, rate=0.1, queries=20),
    Case(128, causal=False, rate=0.1, queries=20, head_dim=24),  # D padded to 32
    Case(128, causal=False, rate=0.1, dtype="bfloat16"),
    Case(200, causal=True, rate=0.0, dtype="bfloat16", block=32),
    # dk/dv visit a range of query blocks and zero the ones inside it that need no key block.
    Case(200, causal=True, rate=0.1, queries=64, block=16, shuffled=True),
]


@pytest.mark.parametrize("case", GPU_CASES, ids=str)
def test_gpu_kernel_equals_xla_path(case):
    inputs, positions, cotangent = _inputs(case)
    positions = None if positions is None else jnp.asarray(positions)
    fused_fn = _impl("flash_gpu", case, block_q=case.block, block_k=case.block, interpret=True)
    _assert_matches_xla(case, fused_fn, inputs, positions, cotangent)


def _assert_matches_xla(case: Case, fused_fn, inputs, positions, cotangent):
    """Context and gradients of ``fused_fn`` equal the XLA path's: within float32 rounding, or
    in bfloat16 as close to the float32 truth as the XLA path itself is."""
    fused = _value_and_grads(fused_fn, inputs, positions, cotangent, _seed(case))
    xla = _value_and_grads(_impl("xla", case), inputs, positions, cotangent, _seed(case))
    names = ("context", "dq", "dk", "dv")
    if case.dtype == "float32":
        for name, got, want in zip(
            names, jax.tree.leaves(fused), jax.tree.leaves(xla), strict=True
        ):
            scale = float(jnp.abs(want).max())
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale, err_msg=name)
        return
    truth_inputs = tuple(x.astype(jnp.float32) if x.dtype == jnp.bfloat16 else x for x in inputs)
    truth = _value_and_grads(_impl("xla", case), truth_inputs, positions, cotangent, _seed(case))
    for name, got, ref, want in zip(
        names, jax.tree.leaves(fused), jax.tree.leaves(xla), jax.tree.leaves(truth), strict=True
    ):
        fused_error = float(jnp.abs(got.astype(jnp.float32) - want).max())
        xla_error = float(jnp.abs(ref.astype(jnp.float32) - want).max())
        assert fused_error <= 1.5 * xla_error + 1e-3 * float(jnp.abs(want).max()), name


def test_all_masked_row_is_uniform_over_keys_and_saves_no_score_array():
    case = Case(200, causal=True, rate=0.0, block=128)
    (query, key, value, key_mask), _, _ = _inputs(case)
    attention_fn = functools.partial(  # no seed: no dropout, whatever the rate
        flash_tpu.flash_attention, causal=True, query_positions=None, dropout_rate=0.1,
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


@pytest.mark.parametrize("kernel", ["flash", "flash_gpu"])
def test_sharded_fused_equals_unsharded_xla_with_dropout(kernel):
    mesh = sharding.create_mesh((2, 2, 2))  # the model's ('data', 'fsdp', 'tensor') mesh
    case = Case(128, causal=True, rate=0.1, batch=4, heads=2, queries=24)
    inputs, positions, cotangent = _inputs(case)
    positions = jnp.asarray(positions)

    def sharded_fn(query, key, value, key_mask, positions, seed):
        return FLASH[kernel].flash_attention(
            query, key, value, key_mask, mesh=mesh, batch_axes=("data", "fsdp"),
            head_axes=("tensor",), causal=True, query_positions=positions, dropout_rate=0.1,
            dropout_seed=seed, interpret=True,
        )  # fmt: skip

    qkv = NamedSharding(mesh, P(("data", "fsdp"), None, "tensor"))
    rows = NamedSharding(mesh, P(("data", "fsdp")))
    placed = [jax.device_put(x, qkv) for x in inputs[:3]] + [jax.device_put(inputs[3], rows)]
    sharded = _value_and_grads(
        sharded_fn, placed, jax.device_put(positions, rows), cotangent, _seed(case)
    )
    xla = _value_and_grads(_impl("xla", case), inputs, positions, cotangent, _seed(case))
    for got, want in zip(jax.tree.leaves(sharded), jax.tree.leaves(xla), strict=True):
        scale = float(jnp.abs(want).max())
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale)


def test_model_dispatch_runs_the_kernel_per_shard_with_the_rules_axes():
    """attention(impl='fused') inside the step's tracing context: shard_map over the mesh axes
    the logical rules give act_batch and act_heads; equal to the unsharded XLA path."""
    mesh = sharding.create_mesh((2, 2, 2))
    case = Case(128, causal=False, rate=0.1, batch=4, heads=2)
    inputs, _, cotangent = _inputs(case)

    with sharding.tracing_on(mesh, sharding.DEFAULT_RULES):
        got = _value_and_grads(_impl("fused", case), inputs, None, cotangent, _seed(case))
    want = _value_and_grads(_impl("xla", case), inputs, None, cotangent, _seed(case))
    for got_leaf, want_leaf in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        scale = float(jnp.abs(want_leaf).max())
        np.testing.assert_allclose(got_leaf, want_leaf, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize(
    "case", [Case(100, causal=True, rate=0.0, queries=20), Case(64, False, 0.0)]
)
def test_cudnn_wrapper_computes_the_xla_path(case):
    """The GPU path's wrapper (bias, scale 1, layout) through jax.nn.dot_product_attention's XLA
    implementation: the same context, an all-padding example's uniform rows included."""
    inputs, positions, _ = _inputs(case)
    positions = None if positions is None else jnp.asarray(positions)
    got = attention._dot_product_attention(*inputs, case.causal, positions, implementation="xla")
    want = _impl("xla", case)(*inputs, positions, None)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_auto_picks_per_platform():
    pick = lambda platform, impl, dropout, dtype="bfloat16": _pick(platform, impl, dropout, dtype)
    assert pick("tpu", "auto", True) == "flash_tpu"
    assert pick("cpu", "auto", True) == "xla" and pick("cpu", "fused", True) == "flash_tpu"
    assert pick("gpu", "auto", False) == "cudnn" and pick("gpu", "fused", False) == "cudnn"
    assert pick("gpu", "auto", True) == "flash_gpu" and pick("gpu", "fused", True) == "flash_gpu"
    assert pick("gpu", "auto", False, "float32") == "flash_gpu"
    assert pick("tpu", "xla", False) == "xla" and pick("gpu", "xla", True) == "xla"


@pytest.mark.parametrize("causal", [False, True])
def test_gpu_kernels_lower_to_triton_for_cuda(causal):
    """The GPU path as a BERT train step runs it (bf16, dropout, the model's dispatch) lowers for
    'cuda' on this CPU machine: JAX's Pallas-to-Triton lowering accepts every kernel (forward,
    dq, dk/dv), and no [B, N, Q, L] array is left in the HLO. (Triton's own compile to PTX is
    the next test.)"""
    batch, length, heads = 2, 128, 2
    tool = _gpu_compile_tool()
    module, kernels = tool.export_for_cuda(batch, length, heads, 64, causal)
    assert module.count(tool.TRITON_CALL) == 3
    assert sorted(kernels) == sorted(tool.KERNELS)
    for name in tool.KERNELS:
        assert f'name = "{name}"' in module, name
    scores = f"tensor<{batch}x{heads}x{length}x{length}x"
    assert scores not in module


@functools.cache
def _gpu_compile_tool():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[2] / "bench" / "gpu_kernels_compile.py"
    spec = importlib.util.spec_from_file_location("gpu_kernels_compile", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_kernels_compile_with_triton_for_hopper_and_ampere_without_spills():
    """The real Triton compiler and ptxas (pip's triton, in the test extra) compile the three
    kernels, as a bf16 BERT-large attention with dropout lowers them, for H100 (sm_90) and A100
    (sm_80), and no kernel spills registers to local memory (bench/gpu_kernels_compile.py prints
    the figures)."""
    pytest.importorskip("triton")
    tool = _gpu_compile_tool()
    _, modules = tool.export_for_cuda(batch=2, length=512, heads=16, head_dim=64, causal=True)
    assert sorted(modules) == sorted(tool.KERNELS)
    for name, ttir in modules.items():
        for arch in (90, 80):
            report = tool.compile_for(ttir, arch)
            assert report["spill_stores"] == report["spill_loads"] == 0, (name, arch, report)


def _pick(platform, impl, dropout, dtype):
    with backend.target(platform):
        return backend.attention_kernel(impl, dropout=dropout, dtype=jnp.dtype(dtype))
