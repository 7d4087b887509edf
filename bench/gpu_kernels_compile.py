"""Compiles the GPU flash-attention kernels for NVIDIA GPUs with the real Triton compiler, on any
machine. No GPU needed, and nothing runs.

JAX lowers the Pallas kernels of ``bertjax/model/attention/gpu/`` to Triton IR (``jax.export`` for
'cuda', as a bf16 train step with attention dropout calls them through the model's dispatch);
pip's ``triton`` then compiles that IR to PTX and ``ptxas`` to a cubin for the named
architectures, as XLA:GPU does on a GPU. Prints per kernel and architecture what ptxas reports:
registers per thread, spill stores / loads, and the shared memory Triton allocates.

    pip install triton==3.9.0          # in the test extra
    python bench/gpu_kernels_compile.py                         # BERT-large heads at 512
    python bench/gpu_kernels_compile.py --length=128 --causal --arch=90

Spills mean a slower kernel, not a wrong one; a compile error means the kernel cannot run there.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import warnings

os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
KERNELS = ("flash_gpu_forward", "flash_gpu_dq", "flash_gpu_dkv")
TRITON_CALL = "__gpu$xla.gpu.triton"  # the custom call XLA:GPU compiles Triton IR from


def export_for_cuda(batch=8, length=512, heads=16, head_dim=64, causal=False, dtype="bfloat16"):
    """(the exported StableHLO text, {kernel name: textual Triton IR}) of the attention's
    forward and backward as a train step calls it (the model's dispatch, dropout 0.1), lowered
    for 'cuda' on this machine."""
    import jax
    import jax.numpy as jnp
    from jax import export
    from jax._src.pallas.triton import pallas_call_registration as registration

    from bertjax.model import attention

    modules = {}
    lower = registration.lowering.lower_jaxpr_to_triton_module

    def keep_text(jaxpr, *args, **kwargs):
        result = lower(jaxpr, *args, **kwargs)
        modules[jaxpr.debug_info.func_name] = result.module.operation.get_asm()
        return result

    def loss(query, key, value, key_mask, seed):
        context = attention.attention(
            query, key, value, key_mask, causal=causal, query_positions=None, dropout_rate=0.1,
            dropout_seed=seed, kernel="gpu",
        )  # fmt: skip
        return context.astype(jnp.float32).sum()

    qkv = jax.ShapeDtypeStruct((batch, length, heads, head_dim), jnp.dtype(dtype))
    args = (qkv, qkv, qkv, jax.ShapeDtypeStruct((batch, length), jnp.int32))
    args += (jax.ShapeDtypeStruct((2,), jnp.uint32),)
    registration.lowering.lower_jaxpr_to_triton_module = keep_text
    try:
        exported = export.export(
            jax.jit(jax.grad(loss, argnums=(0, 1, 2))),
            platforms=["cuda"],
            disabled_checks=[export.DisabledSafetyCheck.custom_call(TRITON_CALL)],
        )(*args)
    finally:
        registration.lowering.lower_jaxpr_to_triton_module = lower
    return exported.mlir_module(), modules


def compile_for(ttir: str, arch: int) -> dict:
    """Compile Triton IR text for sm_``arch`` with the kernels' warps and stages: ptxas's
    registers and spill bytes, and Triton's shared memory."""
    import triton
    from triton.backends.compiler import GPUTarget

    from bertjax.model.attention.gpu.kernels import Plan

    warnings.filterwarnings("ignore", module="triton")
    options = {"num_warps": Plan.num_warps, "num_stages": Plan.num_stages}
    with tempfile.TemporaryDirectory() as scratch:
        source = os.path.join(scratch, "kernel.ttir")
        with open(source, "w") as f:
            f.write(ttir)
        kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
        ptx = os.path.join(scratch, "kernel.ptx")
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        ptxas = os.path.join(
            os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas-blackwell"
        )
        gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
        report = subprocess.run(
            [ptxas, "-v", f"--gpu-name={gpu}", ptx, "-o", os.devnull],
            capture_output=True, text=True, check=True,
        ).stderr  # fmt: skip
    number = lambda pattern: int(re.search(pattern, report).group(1))
    return {
        "registers": number(r"Used (\d+) registers"),
        "spill_stores": number(r"(\d+) bytes spill stores"),
        "spill_loads": number(r"(\d+) bytes spill loads"),
        "shared_bytes": kernel.metadata.shared,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head_dim", type=int, default=64)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--arch", type=int, action="append", help="e.g. 90 (H100), 80 (A100)")
    args = parser.parse_args(argv)
    try:
        import triton  # noqa: F401
    except ImportError:
        print(
            "gpu_kernels_compile.py: needs pip's triton (pip install triton==3.9.0)",
            file=sys.stderr,
        )
        return 2
    _, modules = export_for_cuda(
        length=args.length, heads=args.heads, head_dim=args.head_dim, causal=args.causal,
        dtype=args.dtype,
    )  # fmt: skip
    mask = "causal" if args.causal else "bidirectional"
    print(f"L={args.length} N={args.heads} D={args.head_dim} {args.dtype} {mask}, dropout 0.1")
    print("| kernel | arch | registers | spill stores / loads (bytes) | shared memory (bytes) |")
    print("|---|---|---|---|---|")
    for arch in args.arch or [90, 80]:
        for name in KERNELS:
            r = compile_for(modules[name], arch)
            spills = f"{r['spill_stores']} / {r['spill_loads']}"
            print(f"| {name} | sm_{arch} | {r['registers']} | {spills} | {r['shared_bytes']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
