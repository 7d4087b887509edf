"""What the attention tests share: random inputs with every kind of masked row, a jitted
(context, gradients) of an attention function, and the comparison with the XLA path (the
reference every kernel computes); :func:`interpret`, the switch that runs the kernels natively
on the device instead (``bench/accelerator_check.py`` sets it). Not a test module."""

import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.model import attention
from bertjax.model.attention import self_check

SEED = np.array([0x12345678, 0x9ABCDEF0], np.uint32)
# 'tpu' or 'gpu': that family's kernel tests run natively (interpret=False) when JAX's default
# backend is that platform; unset (CI, CPU): every kernel runs in Pallas interpret mode.
ON_DEVICE = "BERTJAX_ATTENTION_TESTS_ON_DEVICE"


def interpret(family: str, interpreted=True):
    """The ``interpret`` argument for ``family``'s kernel ('tpu' or 'gpu'): ``interpreted`` (True
    or ``pltpu.InterpretParams()``), or False when ``ON_DEVICE`` names ``family`` and the default
    backend is it. A switch naming a platform JAX is not on fails, so that a check meant for the
    device never passes in interpret mode."""
    wanted = os.environ.get(ON_DEVICE, "")
    if not wanted:
        return interpreted
    if wanted not in ("tpu", "gpu"):
        raise ValueError(f"{ON_DEVICE}={wanted!r}: expected 'tpu' or 'gpu'")
    backend = jax.default_backend()
    if backend != wanted:
        raise RuntimeError(f"{ON_DEVICE}={wanted} but JAX's default backend is {backend}")
    return False if family == wanted else interpreted


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
    # Logits of standard deviation ~2 * logit_scale; 8 makes peaked heads, where a bf16 logit
    # would be rounded in steps of 1/8.
    logit_scale: float = 1.0
    packed: bool = False  # key masks of sequence ids: see packed_key_mask
    window: int | None = None  # a local layer's window: keys within it of the query's row


def packed_key_mask(length: int, batch: int) -> np.ndarray:
    """<int32>[B, L] sequence ids: example 0 packed full with 3 instances (boundaries at 39% and
    70% of L: inside kernel blocks), 1 unpacked and partly padding, 2 all padding, 3 packed with
    5 instances (one of them short) then padding."""
    index = np.arange(length)
    ids = lambda fractions: np.searchsorted(
        [round(f * length) for f in fractions], index, side="right"
    )
    rows = [
        ids((0.0, 0.39, 0.7)),
        (index < min(90, length - 7)).astype(np.int64),
        np.zeros(length, np.int64),
        np.where(index < round(0.8 * length), ids((0.0, 0.1, 0.3, 0.33, 0.6)), 0),
    ]
    return np.stack(rows[:batch]).astype(np.int32)


def inputs(case: Case, seed=0):
    """Random q (scaled), k, v <dtype>[B, T, N, D], a cotangent, key mask with example 0 real,
    1 and 3 partly padding, 2 all padding (``packed``: :func:`packed_key_mask`), and sorted
    distinct query positions (or None)."""
    rng = np.random.default_rng(seed)
    b, n, d, length = case.batch, case.heads, case.head_dim, case.length
    queries = case.queries or length
    shape = lambda t: (b, t, n, d)
    query = rng.normal(size=shape(queries)) * 2 * case.logit_scale / np.sqrt(d)
    key, value = rng.normal(size=shape(length)), rng.normal(size=shape(length))
    cotangent = rng.normal(size=shape(queries)).astype(np.float32)
    real = [length, min(90, length - 7), 0, length // 2][:b]
    key_mask = (np.arange(length)[None] < np.array(real)[:, None]).astype(np.int32)
    if case.packed:
        key_mask = packed_key_mask(length, b)
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


def value_and_grads(attention_fn, inputs, positions, cotangent, seed):
    """(context, (dq, dk, dv)) of sum(context * cotangent), jitted."""
    query, key, value, key_mask = inputs

    def loss(query, key, value):
        context = attention_fn(query, key, value, key_mask, positions, seed)
        return jnp.sum(context.astype(jnp.float32) * cotangent), context

    grads, context = jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(query, key, value)
    return context, grads


def seed(case: Case):
    return jnp.asarray(SEED) if case.rate else None


def dispatch(case: Case, kernel: str = "xla"):
    """An attention function of the model's dispatch with ``kernel`` and ``case``'s options."""

    def attention_fn(query, key, value, key_mask, positions, seed):
        return attention.attention(
            query, key, value, key_mask, causal=case.causal, query_positions=positions,
            dropout_rate=case.rate, dropout_seed=seed, kernel=kernel, window=case.window,
        )  # fmt: skip

    return attention_fn


def kernel_fn(flash_attention, case: Case, **options):
    """An attention function of a kernel family's ``flash_attention`` (``options``: blocks,
    interpret, mesh)."""

    def attention_fn(query, key, value, key_mask, positions, seed):
        return flash_attention(
            query, key, value, key_mask, causal=case.causal, query_positions=positions,
            dropout_rate=case.rate, dropout_seed=seed, window=case.window, **options,
        )  # fmt: skip

    return attention_fn


def assert_close(got, want):
    """Leaf by leaf within float32 rounding of the largest magnitude."""
    for got_leaf, want_leaf in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        scale = float(jnp.abs(want_leaf).max())
        np.testing.assert_allclose(got_leaf, want_leaf, rtol=1e-5, atol=1e-5 * scale)


def assert_matches_xla(case: Case, fused_fn, inputs, positions, cotangent, native=None):
    """Context and gradients of ``fused_fn`` equal the XLA path's.

    In Pallas interpret mode (``native`` False; by default, unless ``ON_DEVICE`` is set) float32
    is held within float32 rounding: the interpreter computes as XLA:CPU does. Natively on a GPU
    or TPU, and in bfloat16 everywhere, both paths are held to the float32 truth (the XLA path on
    float32 inputs at the highest matmul precision) by the self-check's rule
    (``bertjax.model.attention.self_check``): ``|fused - truth| <= 2 |xla - truth| + floor * s``,
    since on the device float32 dots run as the platform's default precision has them (TF32 on
    an NVIDIA GPU: 10 bits of mantissa, 3e-4 apart on the H200, 2026-11-26), in an order the
    kernel does not share with XLA's fusions."""
    native = bool(os.environ.get(ON_DEVICE)) if native is None else native
    fused = value_and_grads(fused_fn, inputs, positions, cotangent, seed(case))
    xla = value_and_grads(dispatch(case), inputs, positions, cotangent, seed(case))
    names = ("context", "dq", "dk", "dv")
    if case.dtype == "float32" and not native:
        for name, got, want in zip(
            names, jax.tree.leaves(fused), jax.tree.leaves(xla), strict=True
        ):
            scale = float(jnp.abs(want).max())
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale, err_msg=name)
        return
    truth_inputs = tuple(x.astype(jnp.float32) if x.dtype == jnp.bfloat16 else x for x in inputs)
    with jax.default_matmul_precision("highest"):
        truth = value_and_grads(dispatch(case), truth_inputs, positions, cotangent, seed(case))
    floor = self_check.FLOORS[case.dtype]
    for name, got, ref, want in zip(
        names, jax.tree.leaves(fused), jax.tree.leaves(xla), jax.tree.leaves(truth), strict=True
    ):
        fused_error = float(jnp.abs(got.astype(jnp.float32) - want).max())
        xla_error = float(jnp.abs(ref.astype(jnp.float32) - want).max())
        allowed = 2 * xla_error + floor * float(jnp.abs(want).max())
        assert fused_error <= allowed, (
            f"{name}: {fused_error:.3g} from the truth, allowed {allowed:.3g}"
        )
