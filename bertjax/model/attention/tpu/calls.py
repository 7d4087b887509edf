"""pallas_call wiring of the fused-attention kernels: grids, BlockSpecs, scratch, costs.

Grids are (B, N / heads_per_block, major, minor), the last axis accumulating ("arbitrary"):
key blocks for the forward and dq kernels, query blocks for dk/dv. Every operand's block is
chosen by an index map over the grid indices and the scalar-prefetched ``key_blocks`` and
``query_blocks`` ranges (``common.kernel_inputs``), so skipped tiles re-map to a block already in
VMEM and cost no DMA.
Queries, keys, values and their gradients are <dtype>[B, N*D, T] (positions along lanes); row
stats travel as <float32>[B, N, S, Qp], one [1, bq] row per stat, as the kernels use them.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from bertjax.model.attention.tpu.kernels import (
    Plan,
    backward_kernel,
    dkv_kernel,
    dq_kernel,
    forward_kernel,
)


def _query_major_specs(plan: Plan, num_stats: int) -> dict[str, pl.BlockSpec]:
    """BlockSpecs for grid (b, h, qi, kj). Skipped key steps re-map to the nearest visited
    block (the first before the range, the last after it), so they cost no DMA."""
    bq, bk, width, nq = plan.block_q, plan.block_k, plan.width, plan.num_q_blocks

    def kj_visited(b, qi, kj, key_blocks):
        at = 2 * (b * nq + qi)
        return jnp.clip(kj, key_blocks[at], key_blocks[at + 1] - 1)

    def key_side(block_shape, pick):
        return pl.BlockSpec(
            block_shape,
            lambda b, h, qi, kj, key_blocks, *_: pick(b, h, kj_visited(b, qi, kj, key_blocks)),
        )

    query_row = pl.BlockSpec((1, 1, bq), lambda b, h, qi, kj, *_: (b, 0, qi))
    return {
        "q": pl.BlockSpec((1, width, bq), lambda b, h, qi, kj, *_: (b, h, qi)),
        "kv": key_side((1, width, bk), lambda b, h, kj: (b, h, kj)),
        "stats": pl.BlockSpec(
            (1, plan.heads_per_block, num_stats, bq), lambda b, h, qi, kj, *_: (b, h, 0, qi)
        ),
        "code": key_side((1, bk, 1), lambda b, h, kj: (b, kj, 0)),
        "query_code": query_row,
        "positions": query_row,
    }


def _key_major_specs(plan: Plan) -> dict[str, pl.BlockSpec]:
    """BlockSpecs for grid (b, h, kj, qi); query steps outside the key block's query range
    re-map to the nearest block in it (block 0 when the range is empty)."""
    bq, bk, width, nk = plan.block_q, plan.block_k, plan.width, plan.num_k_blocks

    def qi_visited(b, kj, qi, query_blocks):
        at = 2 * (b * nk + kj)
        return jnp.maximum(jnp.clip(qi, query_blocks[at], query_blocks[at + 1] - 1), 0)

    def q_side(block_shape, pick):
        return pl.BlockSpec(
            block_shape,
            lambda b, h, kj, qi, _, query_blocks, __: pick(
                b, h, qi_visited(b, kj, qi, query_blocks)
            ),
        )

    return {
        "q": q_side((1, width, bq), lambda b, h, qi: (b, h, qi)),
        "kv": pl.BlockSpec((1, width, bk), lambda b, h, kj, qi, *_: (b, h, kj)),
        "stats": q_side((1, plan.heads_per_block, 3, bq), lambda b, h, qi: (b, h, 0, qi)),
        "code": pl.BlockSpec((1, bk, 1), lambda b, h, kj, qi, *_: (b, kj, 0)),
        "query_code": q_side((1, 1, bq), lambda b, h, qi: (b, 0, qi)),
        "positions": q_side((1, 1, bq), lambda b, h, qi: (b, 0, qi)),
    }


def _pallas(plan: Plan, kernel, grid, in_specs, out_specs, out_shape, scratch, cost):
    return pl.pallas_call(
        functools.partial(kernel, plan=plan),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=3,  # key_blocks, query_blocks, params
            grid=grid,
            in_specs=in_specs,
            out_specs=out_specs,
            scratch_shapes=scratch,
        ),
        out_shape=out_shape,
        # The last grid axis accumulates (online softmax, dq, dk/dv); the others are
        # independent, so megacore chips may split them.
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
        cost_estimate=cost,
        interpret=plan.interpret,
    )


def _cost(plan: Plan, matmuls: int, exps: int, resident, streamed, restreams: int):
    """Honest cost for XLA's scheduler and cost analysis: ``resident`` arrays are read or
    written once, ``streamed`` ones once per block of the other sequence (when it has >1)."""
    # The (query, key) pairs of the tiles it can visit: all, or what a window leaves.
    keys = min(plan.padded_keys, plan.visited_key_blocks * plan.block_k)
    pairs = plan.batch * plan.num_heads * plan.padded_queries * keys
    nbytes = lambda arrays: sum(math.prod(x.shape) * x.dtype.itemsize for x in arrays)
    return pl.CostEstimate(
        flops=2 * matmuls * pairs * plan.head_dim,
        transcendentals=exps * pairs,
        bytes_accessed=nbytes(resident) + nbytes(streamed) * max(restreams, 1),
    )


def _mask_operands(plan: Plan, specs, aux):
    """Key codes <int32>[B, Lp] as a column [B, Lp, 1] (keys are sublanes in every tile), query
    codes [B, Qp] as a row [B, 1, Qp] and, causal or windowed, query positions as a row too,
    with their specs."""
    operands = [aux.code[:, :, None], aux.query_code[:, None, :]]
    mask_specs = [specs["code"], specs["query_code"]]
    if plan.needs_positions:
        operands.append(aux.positions[:, None, :])
        mask_specs.append(specs["positions"])
    return operands, mask_specs


def _prefetched(aux):
    return aux.key_blocks, aux.query_blocks, aux.params


def forward_call(plan: Plan, q, k, v, aux):
    """-> context <dtype>[B, N*D, Qp], stats <float32>[B, N, 2, Qp] (row max, row sum)."""
    specs = _query_major_specs(plan, num_stats=2)
    masks, mask_specs = _mask_operands(plan, specs, aux)
    stats = jax.ShapeDtypeStruct((q.shape[0], plan.num_heads, 2, q.shape[2]), jnp.float32)
    hb = plan.heads_per_block
    call = _pallas(
        plan,
        forward_kernel,
        grid=(plan.batch, plan.num_heads // hb, plan.num_q_blocks, plan.num_k_blocks),
        in_specs=[specs["q"], specs["kv"], specs["kv"], *mask_specs],
        out_specs=[specs["q"], specs["stats"]],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), stats],
        scratch=[
            pltpu.VMEM((hb, plan.block_q), jnp.float32),  # running max per query
            pltpu.VMEM((hb, plan.block_q), jnp.float32),  # running sum per query
            pltpu.VMEM((plan.width, plan.block_q), jnp.float32),  # context accumulator
        ],
        cost=_cost(plan, 2, 1, [q, q, stats], [k, v], plan.num_q_blocks * (plan.num_k_blocks > 1)),
    )
    return call(*_prefetched(aux), q, k, v, *masks)


def dq_call(plan: Plan, q, k, v, d_context, stats, aux):
    """-> dq <dtype>[B, N*D, Qp]; ``stats`` <float32>[B, N, 3, Qp] (max, 1 / sum, di)."""
    specs = _query_major_specs(plan, num_stats=3)
    masks, mask_specs = _mask_operands(plan, specs, aux)
    hb = plan.heads_per_block
    call = _pallas(
        plan,
        dq_kernel,
        grid=(plan.batch, plan.num_heads // hb, plan.num_q_blocks, plan.num_k_blocks),
        in_specs=[specs["q"], specs["kv"], specs["kv"], specs["q"], specs["stats"], *mask_specs],
        out_specs=specs["q"],
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch=[
            pltpu.VMEM((plan.width, plan.block_q), jnp.float32),  # dq accumulator
        ],
        cost=_cost(
            plan,
            3,
            1,
            [q, q, d_context, stats],
            [k, v],
            plan.num_q_blocks * (plan.num_k_blocks > 1),
        ),  # fmt: skip
    )
    return call(*_prefetched(aux), q, k, v, d_context, stats, *masks)


def dkv_call(plan: Plan, q, k, v, d_context, stats, aux):
    """-> dk, dv <dtype>[B, N*D, Lp]."""
    specs = _key_major_specs(plan)
    masks, mask_specs = _mask_operands(plan, specs, aux)
    hb = plan.heads_per_block
    call = _pallas(
        plan,
        dkv_kernel,
        grid=(plan.batch, plan.num_heads // hb, plan.num_k_blocks, plan.num_q_blocks),
        in_specs=[specs["q"], specs["kv"], specs["kv"], specs["q"], specs["stats"], *mask_specs],
        out_specs=[specs["kv"], specs["kv"]],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        scratch=[
            pltpu.VMEM((plan.width, plan.block_k), jnp.float32),  # dk accumulator
            pltpu.VMEM((plan.width, plan.block_k), jnp.float32),  # dv accumulator
        ],
        cost=_cost(
            plan,
            4,
            1,
            [k, v, k, v],
            [q, d_context, stats],
            plan.num_k_blocks * (plan.num_q_blocks > 1),
        ),  # fmt: skip
    )
    return call(*_prefetched(aux), q, k, v, d_context, stats, *masks)


def backward_call(plan: Plan, q, k, v, context, d_context, stats, aux):
    """-> dq <dtype>[B, N*D, Qp], dk, dv [B, N*D, Lp] in one kernel, for a single key block;
    ``stats`` the forward's <float32>[B, N, 2, Qp] (max, sum)."""
    if plan.num_k_blocks != 1:
        raise ValueError(f"backward_call needs one key block, got {plan.num_k_blocks}")
    specs = _key_major_specs(plan)
    masks, mask_specs = _mask_operands(plan, specs, aux)
    hb = plan.heads_per_block
    q_spec = pl.BlockSpec((1, plan.width, plan.block_q), lambda b, h, kj, qi, *_: (b, h, qi))
    stats_spec = pl.BlockSpec((1, hb, 2, plan.block_q), lambda b, h, kj, qi, *_: (b, h, 0, qi))
    call = _pallas(
        plan,
        backward_kernel,
        grid=(plan.batch, plan.num_heads // hb, 1, plan.num_q_blocks),
        in_specs=[q_spec, specs["kv"], specs["kv"], q_spec, q_spec, stats_spec, *mask_specs],
        out_specs=[q_spec, specs["kv"], specs["kv"]],
        out_shape=[
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct(k.shape, k.dtype),
            jax.ShapeDtypeStruct(v.shape, v.dtype),
        ],
        scratch=[
            pltpu.VMEM((plan.width, plan.block_k), jnp.float32),  # dk accumulator
            pltpu.VMEM((plan.width, plan.block_k), jnp.float32),  # dv accumulator
        ],
        cost=_cost(plan, 5, 1, [q, k, v, context, d_context, stats, q, k, v], [], 1),
    )
    return call(*_prefetched(aux), q, k, v, context, d_context, stats, *masks)
