"""The Pallas GPU (Triton) flash kernel against the XLA path (Pallas interpret mode on CPU; natively
on a GPU with ``BERTJAX_ATTENTION_TESTS_ON_DEVICE=gpu``: ``cases.interpret``): context and
gradients, dropout included; and against what the GPU compilers accept: JAX's Triton lowering for
'cuda' and the real Triton compiler and ptxas (pip's triton), with no register spills."""

import functools
import importlib.util
import pathlib

import jax.numpy as jnp
import pytest

from bertjax.model.attention import gpu
from tests.model.attention import cases
from tests.model.attention.cases import Case

GPU_CASES = [
    Case(128, causal=False, rate=0.1),
    Case(100, causal=True, rate=0.1, block=32),
    Case(200, causal=True, rate=0.1, queries=20),
    Case(128, causal=False, rate=0.1, queries=20, head_dim=24),  # D padded to 32
    Case(128, causal=False, rate=0.1, dtype="bfloat16"),
    Case(200, causal=True, rate=0.0, dtype="bfloat16", block=32),
    # dk/dv visit a range of query blocks and zero the ones inside it that need no key block.
    Case(200, causal=True, rate=0.1, queries=64, block=16, shuffled=True),
    # Peaked bf16 heads: float32 logits, as the XLA path's (rounded ones would be far off).
    Case(128, causal=True, rate=0.1, dtype="bfloat16", logit_scale=8.0),
    # Packed rows (sequence ids, instances straddling blocks): key block ranges that start past
    # block 0, dk/dv over the mirrored query ranges, blocks inside them that add nothing.
    Case(200, causal=False, rate=0.1, block=32, packed=True),
    Case(200, causal=True, rate=0.0, block=16, packed=True, batch=4),
    Case(200, causal=True, rate=0.1, queries=64, block=16, shuffled=True, packed=True, batch=4),
    Case(200, causal=False, rate=0.1, queries=20, packed=True, batch=4),
    # Local layers (a window of +-20 rows): edges inside blocks, with packing and gathered rows.
    Case(200, causal=False, rate=0.1, block=32, window=20),
    Case(200, causal=False, rate=0.0, block=16, window=20, packed=True, batch=4),
    Case(200, causal=False, rate=0.1, queries=64, block=16, window=20, shuffled=True),
]


@pytest.mark.parametrize("case", GPU_CASES, ids=str)
def test_gpu_kernel_equals_xla_path(case):
    inputs, positions, cotangent = cases.inputs(case)
    positions = None if positions is None else jnp.asarray(positions)
    fused_fn = cases.kernel_fn(
        gpu.flash_attention, case, block_q=case.block, block_k=case.block,
        interpret=cases.interpret("gpu"),
    )  # fmt: skip
    cases.assert_matches_xla(case, fused_fn, inputs, positions, cotangent)


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
    path = pathlib.Path(__file__).parents[4] / "bench" / "gpu_kernels_compile.py"
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
