"""A fused attention kernel against the XLA path, on a device, at a run's head size and dtype.

Interpret mode is not the hardware (matmul precision and the Mosaic/Triton lowerings differ), so
a run checks its kernel where it runs (``bertjax.training.kernel_check``). :func:`compare` runs
:func:`bertjax.model.attention.attention` with ``kernel`` and with ``'xla'`` on a small input:

* shapes (:class:`Shapes`, the run's): batch 2, 2 heads, the run's head size ``D`` and length
  ``L`` (so the kernel runs the blocks the run runs), every query against every key; and, when
  the run's last layer computes only some positions (the gathered last layer: [CLS] and the
  masked positions in pretraining, each instance's [CLS] in packed classification), ``Q`` such
  queries at positions spread over the row, the first at the instances' starts;
* masks: example 0, when the run packs, a packed row of up to three instances (sequence ids 1 on
  [0, 5L/16), 2 on [5L/16, L/2), 3 on [L/2, L): at L = 128 a boundary inside a GPU block and one
  on its edge, so that the GPU kernel skips blocks), else one instance padded after 7L/8;
  example 1 unpacked and padded after 77L/128; causal if the run is;
* the run's dtype and attention dropout rate, dropout on (the counter hash of ``dropout.py``
  draws the same mask on both paths). For the 'gpu' kernel also with dropout off, because there
  a call without dropout may run another kernel (cuDNN's, ``gpu/cudnn.py``: evaluation).

It compares the context and the gradients of q, k and v of ``sum(context * cotangent)``. Both
paths are held to the float32 truth (the XLA path in float32 at the highest matmul precision):
the kernel passes when, for every output, ``|kernel - truth| <= 2 |xla - truth| + floor * s``
with ``s = max |truth|`` and ``floor`` the dtype's (``FLOORS``). The kernel may thus be as
inexact as the XLA path the run would otherwise use (an f32 dot in bf16 passes on a TPU is
allowed where XLA does the same, not where XLA does not), and never worse than the floor by
more than that. A wrong kernel (a scale, a mask, a dropout mask or a gradient off) misses by
orders of magnitude more. A kernel that raises (it does not lower, compile or run on this
device) fails too, with the first line of its error.

Cost: a compile and a run of each of three paths (kernel, XLA, truth) per dropout setting and
query count. At the default shapes (``Shapes()``: L = 128, packed, every query) on
CPU, with the TPU kernel in interpret mode, D = 64, float32, dropout 0.1 (measured 2026-11-25 in
a fresh process on a shared 2-core machine, load average ~10): 2.5 s of CPU time, 3.7-4.3 s
wall; through ``bertjax.training.kernel_check`` 5-6 s wall at that load, for float32, bfloat16
and causal alike. On a TPU or GPU the kernel compiles natively and runs in well under that.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.model import attention

BATCH, HEADS, LENGTH = 2, 2, 128
_SEED = np.array([0x243F6A88, 0x85A308D3], np.uint32)
# Allowed error beyond twice the XLA path's own, as a fraction of the output's largest magnitude.
FLOORS = {"float32": 1e-5, "bfloat16": 1e-3, "float16": 1e-3}
OUTPUTS = ("context", "dq", "dk", "dv")


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The attention calls a run makes (module docstring): ``length`` keys L; ``queries``: the
    gathered last layer's query count Q, 0 when every layer queries all L positions; ``packed``:
    K when rows are packed (example 0 then holds up to three instances), 0 unpacked;
    ``window``: the local layers' window ('modernbert'), checked beside a global call; 0: none."""

    length: int = LENGTH
    queries: int = 0
    packed: int = 3
    window: int = 0

    def sequence_ids(self) -> np.ndarray:
        """<int32>[BATCH, L] the two examples' key masks."""
        length = self.length
        ids = np.zeros((BATCH, length), np.int32)
        if self.packed:
            starts = sorted({0, (5 * length) // 16, length // 2})[: min(self.packed, 3)]
            ids[0] = np.searchsorted(starts, np.arange(length), side="right")
        else:
            ids[0, : max(1, length - length // 8)] = 1
        ids[1, : max(1, (77 * length) // 128)] = 1
        return ids

    def query_positions(self) -> np.ndarray:
        """<int32>[BATCH, Q] the gathered queries' positions: each example's instance starts,
        then positions spread over the row."""
        ids = self.sequence_ids()
        positions = np.round(np.linspace(0, self.length - 1, self.queries)).astype(np.int32)
        positions = np.tile(positions, (BATCH, 1))
        for b in range(BATCH):
            starts = np.flatnonzero(np.diff(ids[b], prepend=0) > 0)[: self.queries]
            positions[b, : len(starts)] = starts
        return positions


@dataclasses.dataclass(frozen=True)
class Difference:
    """One output of one setting: the kernel's and the XLA path's error against the truth."""

    output: str  # 'context', 'dq', 'dk' or 'dv'
    dropout: bool
    queries: int  # Q of a gathered call; 0: every position queries
    kernel_error: float  # max |kernel - truth|
    xla_error: float  # max |xla - truth|
    scale: float  # max |truth|
    floor: float  # the dtype's FLOORS entry
    window: int = 0  # the call's window; 0: global

    @property
    def allowed(self) -> float:
        return 2.0 * self.xla_error + self.floor * self.scale

    @property
    def ratio(self) -> float:
        """kernel error / allowed error (> 1: the kernel fails); NaN counts as failing."""
        ratio = self.kernel_error / max(self.allowed, np.finfo(np.float32).tiny)
        return ratio if np.isfinite(ratio) else np.inf


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What :func:`compare` found: ``worst`` is the output closest to (or furthest past) its
    allowance."""

    kernel: str
    device: str
    head_dim: int
    dtype: str
    dropout_rate: float
    causal: bool
    shapes: Shapes
    differences: tuple[Difference, ...]
    seconds: float
    error: str = ""  # the first line of what the kernel raised ("" when it ran)

    @property
    def worst(self) -> Difference:
        return max(self.differences, key=lambda d: d.ratio)

    @property
    def passed(self) -> bool:
        return not self.error and self.worst.ratio <= 1.0

    def describe(self) -> str:
        """One line: what the kernel raised, or the largest difference with its allowance."""
        if self.error:
            return f"raised {self.error}"
        worst = self.worst
        setting = "with dropout" if worst.dropout else "without dropout"
        length = self.shapes.length
        where = f"{worst.queries} gathered queries" if worst.queries else f"{length} queries"
        if worst.window:
            where += f", window {worst.window}"
        return (
            f"{worst.output} {setting} at L={length}, {where}, differs from the float32 truth "
            f"by {worst.kernel_error:.3g} (XLA path: {worst.xla_error:.3g}, allowed "
            f"{worst.allowed:.3g}, largest value {worst.scale:.3g})"
        )

    def to_dict(self) -> dict:
        settings = {
            "kernel": self.kernel, "device": self.device, "head_dim": self.head_dim,
            "dtype": self.dtype, "dropout_rate": self.dropout_rate, "causal": self.causal,
            "length": self.shapes.length, "queries": self.shapes.queries,
            "packed": self.shapes.packed, "window": self.shapes.window,
        }  # fmt: skip
        if self.error:
            return {**settings, "passed": False, "error": self.error,
                    "seconds": round(self.seconds, 3)}  # fmt: skip
        worst = self.worst
        return {
            **settings, "passed": self.passed, "worst_output": worst.output,
            "worst_dropout": worst.dropout, "worst_queries": worst.queries,
            "worst_window": worst.window,
            "kernel_error": worst.kernel_error, "xla_error": worst.xla_error,
            "allowed": worst.allowed, "seconds": round(self.seconds, 3),
        }  # fmt: skip


def _inputs(head_dim: int, dtype, device, shapes: Shapes):
    """q (scaled), k, v <dtype>[B, L, N, D], key mask <int32>[B, L], cotangent
    <float32>[B, max(L, Q), N, D] (float32 copies of q, k, v too, for the truth), on
    ``device``."""
    rng = np.random.default_rng(0)
    shape = (BATCH, shapes.length, HEADS, head_dim)
    query = rng.normal(size=shape) * 2 / np.sqrt(head_dim)
    key, value = (rng.normal(size=shape) for _ in range(2))
    cotangent = rng.normal(size=(BATCH, max(shapes.length, shapes.queries), HEADS, head_dim))
    # Rounded to the run's dtype first, so that the truth sees the very inputs the paths see.
    low = [np.asarray(jnp.asarray(x, dtype)) for x in (query, key, value)]
    put = lambda x: jax.device_put(x, device)
    return (
        tuple(put(x) for x in low),
        tuple(put(x.astype(np.float32)) for x in low),
        put(shapes.sequence_ids()),
        put(cotangent.astype(np.float32)),
    )


def _value_and_grads(
    kernel, qkv, key_mask, cotangent, *, causal, rate, seed, positions=None, window=0
):
    """(context, dq, dk, dv) <float32> of sum(context * cotangent), jitted; with ``positions``
    <int32>[B, Q] only those queries (a gathered layer's: q and the cotangent taken there)."""

    def loss(query, key, value):
        if positions is not None:
            query = jnp.take_along_axis(query, positions[:, :, None, None], axis=1)
        context = attention.attention(
            query, key, value, key_mask, causal=causal, query_positions=positions,
            dropout_rate=rate, dropout_seed=seed, kernel=kernel, window=window or None,
        )  # fmt: skip
        weights = cotangent[:, : context.shape[1]]
        return jnp.sum(context.astype(jnp.float32) * weights), context

    grads, context = jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(*qkv)
    return [np.asarray(x, np.float32) for x in (context, *grads)]


def compare(kernel: str, *, head_dim: int, dtype: str, dropout_rate: float, causal: bool,
            device=None, shapes: Shapes | None = None) -> Outcome:  # fmt: skip
    """Runs ``kernel`` (a resolved fused kernel: 'tpu', 'gpu', 'tpu_interpret', 'gpu_interpret')
    and the XLA path on ``device`` (default: JAX's default device) at ``shapes`` (default:
    ``Shapes()``); see the module docstring."""
    began = time.perf_counter()
    device, shapes = device or jax.devices()[0], shapes or Shapes()
    qkv, qkv32, key_mask, cotangent = _inputs(head_dim, jnp.dtype(dtype), device, shapes)
    seed = jax.device_put(_SEED, device)
    floor, differences = FLOORS[str(jnp.dtype(dtype))], []
    rates = (dropout_rate, 0.0) if kernel == "gpu" and dropout_rate > 0 else (dropout_rate,)
    gathered = [None] + ([shapes.query_positions()] if shapes.queries else [])
    windows = [0] + ([shapes.window] if shapes.window else [])
    settings = (kernel, device.device_kind, head_dim, str(jnp.dtype(dtype)), float(dropout_rate),
                causal, shapes)  # fmt: skip
    for rate, positions, window in itertools.product(rates, gathered, windows):
        where = None if positions is None else jax.device_put(positions, device)
        options = dict(causal=causal, rate=rate, seed=seed, positions=where, window=window)
        try:
            got = _value_and_grads(kernel, qkv, key_mask, cotangent, **options)
        except Exception as e:  # a kernel that does not lower, compile or run here fails too
            lines = str(e).strip().splitlines()
            error = f"{type(e).__name__}: {lines[0] if lines else ''}".rstrip(": ")
            return Outcome(*settings, tuple(differences), time.perf_counter() - began, error)
        xla = _value_and_grads("xla", qkv, key_mask, cotangent, **options)
        with jax.default_matmul_precision("highest"):
            truth = _value_and_grads("xla", qkv32, key_mask, cotangent, **options)
        queries = 0 if positions is None else positions.shape[1]
        for name, g, x, t in zip(OUTPUTS, got, xla, truth, strict=True):
            error, xla_error, scale = (float(np.abs(d).max()) for d in (g - t, x - t, t))
            differences.append(
                Difference(name, rate > 0, queries, error, xla_error, scale, floor, window)
            )
    return Outcome(*settings, tuple(differences), time.perf_counter() - began)
