"""fp32 matmuls on XLA:CPU through a vendor BLAS (MKL), as an XLA FFI custom call.

Why: on CPU, XLA's own dot kernels reach 0.75-1.0x of MKL's sgemm on BERT's shapes
(``bench/gemm_bench.py``), and dots are most of a CPU train step (docs/benchmarks.md).
``model.matmul = 'blas'`` routes the encoder's dense layers and the tied MLM decoder through
:func:`dot`; everything else stays in XLA.

Contract of :func:`dot` (differentiable, jit-able, abstract-evaluable)::

    dot(a, b, trans_a=False, trans_b=False) -> op(a) . op(b)
    a <float32>[M, K] (or [K, M] with trans_a), b <float32>[K, N] (or [N, K] with trans_b)
    -> <float32>[M, N]; rank-3 operands with a shared leading batch dim give <float32>[G, M, N].

It runs on one CPU device only: XLA cannot partition the custom call, so under a multi-device
mesh it would gather whole operands. :func:`resolve` turns ``model.matmul = 'auto'`` into
``'blas'`` only for a single-device CPU process on an Intel CPU with the kernel available, else
``'xla'``: MKL runs its optimised code paths on Intel processors only, and on an AMD EPYC (Zen 4,
AVX-512) its sgemm measured 0.50-0.93x XLA's dots on BERT's shapes (``bench/gemm_bench.py``,
docs/benchmarks.md), where on Intel it measured 1.0-1.34x. :func:`auto_choice` says which and why.

The kernel (``cpu_gemm.cc``, shipped with the package) is compiled on first use with the system
C++ compiler (``$CXX``, else ``c++``/``g++``) against jaxlib's FFI headers and cached
(:func:`bertjax.native.build`: ``$BERTJAX_CACHE_DIR``, keyed by the source, the jaxlib version,
the compiler and its flags). MKL comes from
the ``mkl`` wheel (a dependency on x86-64 Linux) with its sequential threading layer: the
kernel splits each GEMM over XLA's intra-op threads itself. If either is missing,
:func:`available` is False with the reason in :func:`unavailable_reason`, and 'auto' uses XLA.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import pathlib
import sys

import jax
import jax.numpy as jnp
import jaxlib

from bertjax import native

MATMULS = ("xla", "blas")
_TARGET = "bertjax_sgemm"
_SOURCE = pathlib.Path(__file__).with_name("cpu_gemm.cc")
_MKL_SEQUENTIAL = 1  # MKL_THREADING_SEQUENTIAL of mkl_service.h
_LOADED: list[ctypes.CDLL] = []  # MKL and the kernel, kept loaded for the life of the process


class KernelUnavailable(RuntimeError):
    """The BLAS kernel cannot be built or loaded here; the message says why."""


def _compile() -> pathlib.Path:
    try:
        return native.build(
            _SOURCE,
            compiler_env="CXX",
            compilers=("c++", "g++"),
            flags=["-O3", "-std=c++17", f"-I{jax.ffi.include_dir()}"],
            identity=[jaxlib.__version__],
        )
    except native.BuildError as e:
        raise KernelUnavailable(str(e)) from None


def _mkl_library() -> ctypes.CDLL:
    try:
        files = importlib.metadata.files("mkl") or []
    except importlib.metadata.PackageNotFoundError:
        raise KernelUnavailable("the 'mkl' package is not installed") from None
    paths = [f.locate() for f in files if f.name.startswith("libmkl_rt.so")]
    if not paths:
        raise KernelUnavailable("the 'mkl' package has no libmkl_rt.so")
    mkl = ctypes.CDLL(str(paths[0]))
    # Must precede any other MKL call: one thread per sgemm, XLA's pool supplies the rest.
    mkl.MKL_Set_Threading_Layer(ctypes.c_int(_MKL_SEQUENTIAL))
    return mkl


@functools.cache
def _load() -> str | None:
    """Builds, loads and registers the kernel once; the reason it is unavailable, or None."""
    if sys.platform != "linux":
        return f"the BLAS kernel is built for Linux only (this is {sys.platform})"
    try:
        mkl = _mkl_library()
        kernel = ctypes.CDLL(str(_compile()))
    except (KernelUnavailable, OSError) as e:
        return str(e)
    kernel.bertjax_set_sgemm(ctypes.cast(mkl.cblas_sgemm, ctypes.c_void_p))
    _LOADED.extend((mkl, kernel))
    jax.ffi.register_ffi_target(_TARGET, jax.ffi.pycapsule(kernel.BertjaxSgemm), platform="cpu")
    return None


def available() -> bool:
    return _load() is None


def unavailable_reason() -> str | None:
    return _load()


@functools.cache
def cpu_vendor() -> str | None:
    """The CPU's vendor id from /proc/cpuinfo ('GenuineIntel', 'AuthenticAMD', ...), or None."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id":
                    return value.strip()
    except OSError:
        pass
    return None


def auto_choice(num_devices: int | None = None) -> tuple[str, str]:
    """What ``model.matmul='auto'`` becomes in this process, and why: ``(matmul, reason)``."""
    if num_devices is None:
        num_devices = jax.device_count()
    if jax.default_backend() != "cpu":
        return "xla", f"the backend is {jax.default_backend()}"
    if num_devices != 1:
        return "xla", f"{num_devices} devices, the kernel runs on one"
    vendor = cpu_vendor()
    if vendor != "GenuineIntel":
        return "xla", f"MKL is not optimised for this CPU, vendor {vendor or 'unknown'}"
    if not available():
        return "xla", f"the MKL kernel is unavailable: {unavailable_reason().splitlines()[0]}"
    return "blas", "one Intel CPU device and the MKL kernel loaded"


def describe(matmul: str) -> str:
    """``'<engine> (<why>)'`` for a configured ``model.matmul``, as training and benches print."""
    if matmul == "auto":
        return "{} ({})".format(*auto_choice())
    return f"{resolve(matmul)} (set in the config)"


def resolve(matmul: str, num_devices: int | None = None) -> str:
    """``'auto'`` -> :func:`auto_choice`'s pick ('blas' on one Intel CPU device with the kernel
    available, else 'xla'). ``'xla'`` and ``'blas'`` pass through; 'blas' is checked to be loadable.
    """
    if matmul not in (*MATMULS, "auto"):
        raise ValueError(f"model.matmul={matmul!r}: expected one of {(*MATMULS, 'auto')}")
    if matmul == "auto":
        return auto_choice(num_devices)[0]
    if matmul == "blas" and jax.default_backend() != "cpu":
        raise ValueError(f"model.matmul='blas' runs on CPU, this is {jax.default_backend()}")
    if matmul == "blas" and not available():
        raise ValueError(f"model.matmul='blas': {unavailable_reason()}")
    return matmul


def mesh_error(matmul: str, mesh_size: int) -> str | None:
    """Why ``matmul`` cannot run on a mesh of ``mesh_size`` devices, or None if it can."""
    if matmul == "blas" and mesh_size > 1:
        return (
            f"config.model.matmul='blas' runs on one CPU device, the mesh has {mesh_size} "
            "(use 'auto' or 'xla')"
        )
    return None


def _gemm(a: jax.Array, b: jax.Array, trans_a: bool, trans_b: bool) -> jax.Array:
    if not available():
        raise RuntimeError(f"bertjax BLAS kernel: {unavailable_reason()}")
    m = a.shape[-1] if trans_a else a.shape[-2]
    n = b.shape[-2] if trans_b else b.shape[-1]
    out = jax.ShapeDtypeStruct((*a.shape[:-2], m, n), jnp.float32)
    call = jax.ffi.ffi_call(_TARGET, out)
    return call(a, b, trans_a=int(trans_a), trans_b=int(trans_b))


def _check(a: jax.Array, b: jax.Array, trans_a: bool, trans_b: bool) -> None:
    if a.dtype != jnp.float32 or b.dtype != jnp.float32:
        raise TypeError(f"cpu_gemm.dot takes float32 operands, got {a.dtype} and {b.dtype}")
    if a.ndim not in (2, 3) or b.ndim != a.ndim or a.shape[:-2] != b.shape[:-2]:
        raise ValueError(f"cpu_gemm.dot: operands {a.shape} and {b.shape} are not both rank 2 or 3")
    k_a = a.shape[-2] if trans_a else a.shape[-1]
    k_b = b.shape[-1] if trans_b else b.shape[-2]
    if k_a != k_b:
        raise ValueError(f"cpu_gemm.dot: contracting dims differ ({a.shape}, {b.shape})")


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _dot(a, b, trans_a, trans_b):
    return _gemm(a, b, trans_a, trans_b)


def _dot_fwd(a, b, trans_a, trans_b):
    return _gemm(a, b, trans_a, trans_b), (a, b)


def _dot_bwd(trans_a, trans_b, residuals, g):
    # c = op(a) op(b). The gradient of op(a) is g op(b)^T and of op(b) is op(a)^T g; a stored
    # transposed gets the transpose of that product, which is again one GEMM with swapped operands.
    a, b = residuals
    da = _gemm(b, g, trans_b, True) if trans_a else _gemm(g, b, False, not trans_b)
    db = _gemm(g, a, True, trans_a) if trans_b else _gemm(a, g, not trans_a, False)
    return da, db


_dot.defvjp(_dot_fwd, _dot_bwd)


def dot(a: jax.Array, b: jax.Array, trans_a: bool = False, trans_b: bool = False) -> jax.Array:
    """``op(a) . op(b)`` on the BLAS kernel; see the module docstring for shapes."""
    _check(a, b, trans_a, trans_b)
    return _dot(a, b, bool(trans_a), bool(trans_b))
