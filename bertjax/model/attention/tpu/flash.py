"""Flash attention as Pallas TPU kernels, with the counter-hash attention dropout.

Computes exactly ``bertjax.model.attention``'s XLA path (see its docstring for the function),
dropout included: an online softmax over key blocks that keeps only the context and two float32
stats per query row in HBM (never a [B, N, Q, L] array), and a ``custom_vjp`` whose backward
kernels (``kernels.py``, wired in ``calls.py``) recompute the probabilities
and the dropout mask tile by tile from global (b, n, q, k) indices: one kernel for dq, dk and dv
when the keys fit one block (any length up to 512 by default: every BERT config), else a dq and
a dk/dv kernel. :func:`flash_attention` hands the kernels [B, N*D, T] operands, sequence along
lanes, which is the layout the TPU compiler gives the [B, T, N, D] projections (so the
transposes cost no copy), pads to whole blocks, and under a mesh runs the kernel per shard with
``shard_map`` (batch and heads only; the sequence axis is never split).

The 'tpu' kernel of ``bertjax.model.attention``; 'tpu_interpret' runs it in Pallas interpret mode,
where the tests compare it with the XLA path on CPU. The real TPU compiler compiles it on any
machine with libtpu (``python -m bertjax.compile``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from bertjax.model.attention import common
from bertjax.model.attention.tpu import calls, kernels

# Default tiles, clipped to the 128-padded lengths. bk = 512 holds a whole BERT-512 key row, so
# the online softmax takes one step (no rescaling), K/V blocks are fetched once per query block
# and one backward kernel does dq, dk and dv; bq = 256 keeps a [512, 256] float32 score tile at
# 512 KiB, so the ~6 live tiles of the backward (scores, probabilities, mask, dP, dS) fit the
# 16 MiB default scoped VMEM of v4/v5e with room for double-buffered inputs, while still giving
# B * N * 2 parallel steps.
# Both are multiples of 128: positions are lanes in every kernel operand, and the MXU is 128 wide.
DEFAULT_BLOCK_Q = 256
DEFAULT_BLOCK_K = 512
_LANES = 128
_SUBLANES = 16


def flash_attention(query, key, value, key_mask, **kwargs):
    """``common.sharded`` over this module's kernels (arguments and mesh there); ``interpret``:
    False (Mosaic, on a TPU), True or ``pltpu.InterpretParams`` (Pallas' interpreter, anywhere)."""
    return common.sharded(_fused_attention, query, key, value, key_mask, **kwargs)


def _default_block(length: int, limit: int) -> int:
    """The largest multiple of 128 up to ``limit`` dividing the 128-padded length: no padding
    beyond the next 128 (L = 384 gives 128-row query blocks, not 256 and a third wasted)."""
    padded = common.round_up(length, _LANES)
    return max(b for b in range(_LANES, min(limit, padded) + 1, _LANES) if padded % b == 0)


def _heads_per_block(num_heads: int, head_dim: int) -> int:
    """One head per block when its D rows are whole sublane tiles (16 rows of packed bf16),
    else all heads (a block of the whole N*D dimension is always a legal block)."""
    return 1 if head_dim % _SUBLANES == 0 else num_heads


def _make_plan(
    query, key, *, causal, dropout_rate, block_q=None, block_k=None, interpret=False,
    window=None, **totals,
):  # fmt: skip
    batch, num_queries, num_heads, head_dim = query.shape
    length = key.shape[1]
    block_q = block_q or _default_block(num_queries, DEFAULT_BLOCK_Q)
    block_k = block_k or _default_block(length, DEFAULT_BLOCK_K)
    if block_q % _LANES or block_k % _LANES:
        raise ValueError(f"block_q={block_q} and block_k={block_k} must be multiples of 128")
    return kernels.Plan(
        batch=batch,
        num_heads=num_heads,
        head_dim=head_dim,
        heads_per_block=_heads_per_block(num_heads, head_dim),
        block_q=block_q,
        block_k=block_k,
        padded_queries=common.round_up(num_queries, block_q),
        padded_keys=common.round_up(length, block_k),
        causal=causal,
        dropout_rate=float(dropout_rate),
        interpret=interpret,
        window=window,
        **totals,
    )


def _fused_attention(query, key, value, key_mask, query_positions, seed, offsets, **options):
    """Pads to whole blocks, runs the kernels, drops the padding. ``offsets`` <int32>[2]: the
    shard's first global example and head. Shapes as :func:`flash_attention`."""
    plan = _make_plan(query, key, **options)
    batch, num_queries, num_heads, head_dim = query.shape
    aux = common.kernel_inputs(plan, key_mask, query_positions, seed, offsets, num_queries)

    def flat(x, padded):  # [B, T, N, D] -> zero-padded [B, N * D, padded] (kernels' layout)
        x = x.reshape(batch, x.shape[1], num_heads * head_dim).transpose(0, 2, 1)
        return jnp.pad(x, ((0, 0), (0, 0), (0, padded - x.shape[2])))

    q = flat(query, plan.padded_queries)
    context = _flash(plan, q, flat(key, plan.padded_keys), flat(value, plan.padded_keys), aux)
    context = context[:, :, :num_queries].transpose(0, 2, 1)
    return context.reshape(batch, num_queries, num_heads, head_dim)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(plan, q, k, v, aux):
    """<dtype>[B, N*D, Qp] queries, [B, N*D, Lp] keys and values -> [B, N*D, Qp] context."""
    return calls.forward_call(plan, q, k, v, aux)[0]


CHECKPOINT_NAMES = common.CHECKPOINT_NAMES


def _flash_fwd(plan, q, k, v, aux):
    context, stats = calls.forward_call(plan, q, k, v, aux)
    context = checkpoint_name(context, CHECKPOINT_NAMES[0])
    stats = checkpoint_name(stats, CHECKPOINT_NAMES[1])
    return context, (q, k, v, aux, context, stats)


def _flash_bwd(plan, residuals, d_context):
    q, k, v, aux, context, stats = residuals
    if plan.num_k_blocks == 1:  # every BERT length: one kernel, di computed inside it
        dq, dk, dv = calls.backward_call(plan, q, k, v, context, d_context, stats, aux)
        return dq, dk, dv, None
    products = d_context.astype(jnp.float32) * context.astype(jnp.float32)  # [B, N*D, Qp]
    di = products.reshape(products.shape[0], plan.num_heads, plan.head_dim, -1).sum(axis=2)
    # [B, N, 3, Qp] rows (max, 1 / sum, rowsum(dO * O)): what P and dS need per query.
    backward_stats = jnp.stack([stats[:, :, 0], 1.0 / stats[:, :, 1], di], axis=2)
    dq = calls.dq_call(plan, q, k, v, d_context, backward_stats, aux)
    dk, dv = calls.dkv_call(plan, q, k, v, d_context, backward_stats, aux)
    return dq, dk, dv, None


_flash.defvjp(_flash_fwd, _flash_bwd)
