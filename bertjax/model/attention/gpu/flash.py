"""Flash attention as Pallas GPU (Triton) kernels, with the counter-hash attention dropout.

The GPU twin of ``bertjax.model.attention.tpu``: the same function as the XLA path of
``bertjax.model.attention``, dropout included, without a [B, N, Q, L] array in memory. The
forward kernel keeps the context and two float32 stats per query row; a ``custom_vjp`` runs a dq
kernel (grid over query blocks) and a dk/dv kernel (grid over key blocks) that recompute the
probabilities and the dropout mask tile by tile (``kernels.py``); di = rowsum(dO * O) is one
fused XLA reduction. Under a mesh it runs per (batch, heads) shard (``common.sharded``).

The 'gpu' kernel of ``bertjax.model.attention`` runs it wherever cuDNN's fused attention
(``cudnn.py``) cannot run the call: with attention dropout (training) or in float32.
'gpu_interpret' runs it in Pallas interpret mode, where the tests compare it with the XLA path
on CPU; ``jax.export`` for 'cuda' lowers it to Triton on any machine
(``tests/model/attention/gpu/flash_test.py``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from bertjax.model.attention import common
from bertjax.model.attention.gpu import kernels

# Default tiles (clipped to short sequences): 64 x 64 keeps the backward's live [bq, bk]
# float32 tiles (scores, probabilities, dP, dS) in registers at 4 warps for D <= 64.
DEFAULT_BLOCK_Q = 64
DEFAULT_BLOCK_K = 64
_MIN_TILE = 16  # Triton's smallest dot operand dimension


def flash_attention(query, key, value, key_mask, **kwargs):
    """``common.sharded`` over this module's kernels (arguments and mesh there); ``interpret``:
    False (Triton, on a GPU) or True (Pallas' interpreter, anywhere)."""
    return common.sharded(_fused_attention, query, key, value, key_mask, **kwargs)


def _power_of_two(x: int) -> int:
    return max(_MIN_TILE, pl.next_power_of_2(x))


def _make_plan(
    query, key, *, causal, dropout_rate, block_q=None, block_k=None, interpret=False,
    window=None, **totals,
):  # fmt: skip
    batch, num_queries, num_heads, head_dim = query.shape
    length = key.shape[1]
    block_q = block_q or min(DEFAULT_BLOCK_Q, _power_of_two(num_queries))
    block_k = block_k or min(DEFAULT_BLOCK_K, _power_of_two(length))
    for name, block in (("block_q", block_q), ("block_k", block_k)):
        if block < _MIN_TILE or block & (block - 1):
            raise ValueError(f"{name}={block} must be a power of two >= {_MIN_TILE}")
    return kernels.Plan(
        batch=batch,
        num_heads=num_heads,
        head_dim=_power_of_two(head_dim),
        block_q=block_q,
        block_k=block_k,
        padded_queries=common.round_up(num_queries, block_q),
        padded_keys=common.round_up(length, block_k),
        causal=causal,
        dropout_rate=float(dropout_rate),
        interpret=bool(interpret),
        window=window,
        block_q_dkv=min(block_q, kernels.Plan.block_q_dkv),
        **totals,
    )


def _fused_attention(query, key, value, key_mask, query_positions, seed, offsets, **options):
    """Pads to whole blocks (and D to a power of two), runs the kernels, drops the padding."""
    plan = _make_plan(query, key, **options)
    num_queries, head_dim = query.shape[1], query.shape[3]
    aux = common.kernel_inputs(plan, key_mask, query_positions, seed, offsets, num_queries)

    def pad(x, padded):  # zeros add nothing to q . k, and give zero context columns
        widths = ((0, 0), (0, padded - x.shape[1]), (0, 0), (0, plan.head_dim - head_dim))
        return jnp.pad(x, widths)

    q = pad(query, plan.padded_queries)
    context = _flash(plan, q, pad(key, plan.padded_keys), pad(value, plan.padded_keys), aux)
    return context[:, :num_queries, :, :head_dim]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(plan, q, k, v, aux):
    """<dtype>[B, Qp, N, Dp] queries, [B, Lp, N, Dp] keys and values -> [B, Qp, N, Dp]."""
    return _forward_call(plan, q, k, v, aux)[0]


def _flash_fwd(plan, q, k, v, aux):
    context, row_max, row_sum = _forward_call(plan, q, k, v, aux)
    context = checkpoint_name(context, common.CHECKPOINT_NAMES[0])
    row_max, row_sum = (checkpoint_name(x, common.CHECKPOINT_NAMES[1]) for x in (row_max, row_sum))
    return context, (q, k, v, aux, context, row_max, row_sum)


def _flash_bwd(plan, residuals, d_context):
    q, k, v, aux, context, row_max, row_sum = residuals
    di = jnp.sum(d_context.astype(jnp.float32) * context.astype(jnp.float32), axis=3)
    stats = (row_max, row_sum, di.transpose(0, 2, 1))  # <float32>[B, N, Qp] each
    dq = _dq_call(plan, q, k, v, d_context, stats, aux)
    dk, dv = _dkv_call(plan, q, k, v, d_context, stats, aux)
    return dq, dk, dv, None


_flash.defvjp(_flash_fwd, _flash_bwd)


# pallas_call wiring. Grids are (B, N, blocks): query blocks for the forward and dq kernels, key
# blocks for dk/dv; a program's block of a [B, T, N, Dp] array is one head's [block, Dp] rows,
# the other side's arrays come whole ([T, Dp] of that head) and are sliced in the loop.


def _specs(plan: kernels.Plan, query_major: bool) -> dict[str, pl.BlockSpec]:
    bq, bk, qp, lp, dp = (
        plan.block_q, plan.block_k, plan.padded_queries, plan.padded_keys, plan.head_dim
    )  # fmt: skip
    own_q, own_k = (bq, lp) if query_major else (qp, bk)
    q_index = (lambda b, h, i: (b, i, h, 0)) if query_major else (lambda b, h, i: (b, 0, h, 0))
    k_index = (lambda b, h, i: (b, 0, h, 0)) if query_major else (lambda b, h, i: (b, i, h, 0))
    return {
        "q": pl.BlockSpec((None, own_q, None, dp), q_index),
        "k": pl.BlockSpec((None, own_k, None, dp), k_index),
        "stats": pl.BlockSpec((None, None, own_q), lambda b, h, i: (b, h, i if query_major else 0)),
        "code": pl.BlockSpec((None, own_k), lambda b, h, i: (b, 0 if query_major else i)),
        "query_code": pl.BlockSpec((None, own_q), lambda b, h, i: (b, i if query_major else 0)),
        "positions": pl.BlockSpec((None, own_q), lambda b, h, i: (b, i if query_major else 0)),
    }


def _whole(array) -> pl.BlockSpec:
    return pl.BlockSpec(array.shape, lambda b, h, i: (0,) * array.ndim)


def _pallas(plan, kernel, name, grid, operands, out_specs, out_shape):
    """``operands``: (BlockSpec, array) pairs in the kernel's argument order."""
    in_specs, args = zip(*operands, strict=True)
    return pl.pallas_call(
        functools.partial(kernel, plan=plan),
        grid=grid,
        in_specs=list(in_specs),
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=plgpu.CompilerParams(num_warps=plan.num_warps, num_stages=plan.num_stages),
        interpret=plan.interpret,
        name=name,
    )(*args)


def _operands(plan, specs, tensors, aux, ranges):
    """(ranges, params, *tensors, code, query_code[, positions]) with their specs; ``ranges``:
    ``aux.key_blocks`` (forward, dq) or the dk/dv kernel's query sub-block ranges."""
    operands = [(_whole(ranges), ranges), (_whole(aux.params), aux.params), *tensors]
    operands += [(specs["code"], aux.code), (specs["query_code"], aux.query_code)]
    if plan.needs_positions:
        operands.append((specs["positions"], aux.positions))
    return operands


def _forward_call(plan, q, k, v, aux):
    """(context <dtype>[B, Qp, N, Dp], row max and sum <float32>[B, N, Qp])."""
    specs = _specs(plan, query_major=True)
    tensors = [(specs["q"], q), (specs["k"], k), (specs["k"], v)]
    stats = jax.ShapeDtypeStruct((plan.batch, plan.num_heads, plan.padded_queries), jnp.float32)
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype), stats, stats]
    return _pallas(
        plan, kernels.forward_kernel, "flash_gpu_forward",
        (plan.batch, plan.num_heads, plan.num_q_blocks),
        _operands(plan, specs, tensors, aux, aux.key_blocks),
        [specs["q"], specs["stats"], specs["stats"]], out_shape,
    )  # fmt: skip


def _backward_tensors(specs, q, k, v, d_context, stats):
    tensors = [(specs["q"], q), (specs["k"], k), (specs["k"], v), (specs["q"], d_context)]
    return tensors + [(specs["stats"], x) for x in stats]


def _dq_call(plan, q, k, v, d_context, stats, aux):
    specs = _specs(plan, query_major=True)
    tensors = _backward_tensors(specs, q, k, v, d_context, stats)
    return _pallas(
        plan, kernels.dq_kernel, "flash_gpu_dq",
        (plan.batch, plan.num_heads, plan.num_q_blocks),
        _operands(plan, specs, tensors, aux, aux.key_blocks),
        specs["q"], jax.ShapeDtypeStruct(q.shape, q.dtype),
    )  # fmt: skip


def _query_range(plan: kernels.Plan, query_blocks) -> jax.Array:
    """<int32>[B * nk * 2]: ``query_blocks`` (per (example, key block) the query blocks
    [first, end) whose key range holds it) in sub-blocks of ``block_q_dkv`` rows."""
    return (query_blocks * (plan.block_q // plan.block_q_dkv)).astype(jnp.int32)


def _dkv_call(plan, q, k, v, d_context, stats, aux):
    specs = _specs(plan, query_major=False)
    query_range = _query_range(plan, aux.query_blocks)
    tensors = _backward_tensors(specs, q, k, v, d_context, stats)
    out_shape = [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)]
    return _pallas(
        plan, kernels.dkv_kernel, "flash_gpu_dkv",
        (plan.batch, plan.num_heads, plan.num_k_blocks),
        _operands(plan, specs, tensors, aux, query_range),
        [specs["k"], specs["k"]], out_shape,
    )  # fmt: skip
