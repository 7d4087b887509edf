"""Pallas TPU kernels of the fused attention: forward, dq, and dk/dv (see ``flash_tpu.py``).

Layouts are the model's own, flattened over heads: queries <dtype>[B, Qp, N*D], keys and values
<dtype>[B, Lp, N*D] (Qp, Lp: padded to the block sizes). A grid step sees a [block, W] slab of
W = heads_per_block * D lanes (at least 128, so D = 64 heads travel in pairs with no padding and
no transpose in HBM) and handles its heads one at a time by zeroing the other heads' lanes in
one operand: a [bq, W] x [W, bk] product contracts head h only and costs the MXU the same passes
as a [bq, D] x [D, bk] one for D <= 128 (the MXU is 128 deep).

Per tile every kernel recomputes, for the (query, key) pairs it owns,

    s = float32(dtype(q . k)) + bias      bias: 0 allowed, -1e9 masked, -inf padding key
    p = exp(s - m) / l                    m, l: per-row max and sum over all keys (forward)
    keep, scale = counter-hash dropout of the global (b, n, q, k)  (``bertjax.model.dropout``)

which is the XLA path's arithmetic, so a tile's probabilities equal the [B, N, Q, L] array's.
The logits are rounded through ``dtype`` because the XLA einsum returns them in ``dtype``.

Scalar-prefetched operands: ``needed`` <int32>[B * nq], the number of leading key blocks query
block qi of example b must visit (later blocks hold only masked keys, which add exactly 0), and
``params`` <int32>[4] = (seed0, seed1, batch_offset, head_offset). Forward and backward visit the
same (query block, key block) pairs, so a recomputed ``s - m`` is never positive.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from bertjax.model import dropout as dropout_lib

MASK_VALUE = -1e9  # the XLA path's additive mask (finite: an all-masked row is uniform)
_NT = (((1,), (1,)), ((), ()))  # contract the last dims: [m, W] x [n, W] -> [m, n]
_LANES = 128


@dataclasses.dataclass(frozen=True)
class Plan:
    """Static description of one fused-attention call (hashable: a custom_vjp static arg)."""

    batch: int  # local (per shard) B
    num_heads: int  # local N
    head_dim: int
    heads_per_block: int
    block_q: int
    block_k: int
    padded_queries: int  # Qp
    padded_keys: int  # Lp
    causal: bool
    dropout_rate: float
    total_heads: int  # global N: the dropout row index is global
    total_queries: int  # global Q
    interpret: Any  # False, True (interpret on the host), or pltpu.InterpretParams

    @property
    def width(self) -> int:
        return self.heads_per_block * self.head_dim

    @property
    def num_q_blocks(self) -> int:
        return self.padded_queries // self.block_q

    @property
    def num_k_blocks(self) -> int:
        return self.padded_keys // self.block_k

    @property
    def dropout(self) -> bool:
        return dropout_lib.keep_threshold(self.dropout_rate) > 0


def head_lanes(plan: Plan, head: int) -> jax.Array:
    """<bool>[1, W]: the lanes of head ``head`` within a block."""
    lane = jax.lax.broadcasted_iota(jnp.int32, (1, plan.width), 1)
    return (lane >= head * plan.head_dim) & (lane < (head + 1) * plan.head_dim)


def tile_bias(code, key_index, positions) -> jax.Array:
    """Additive <float32> bias from broadcastable key codes (1 real, 0 masked, -1 padding),
    global key indices and query positions (None: bidirectional)."""
    allowed = code == 1
    if positions is not None:
        allowed = allowed & (key_index <= positions)
    masked = jnp.where(allowed, jnp.float32(0.0), jnp.float32(MASK_VALUE))
    # -inf, not -1e9: a padding key must add exactly 0 even to a row whose keys are all masked.
    return jnp.where(code < 0, jnp.float32(-jnp.inf), masked)


def tile_scores(lhs, rhs, bias) -> jax.Array:
    """<float32>[m, n] = float32(dtype(lhs . rhs^T)) + bias, for lhs <dtype>[m, W]."""
    dot = jax.lax.dot_general(lhs, rhs, _NT, preferred_element_type=jnp.float32)
    return dot.astype(lhs.dtype).astype(jnp.float32) + bias


def dropout_rows(plan: Plan, params_ref, batch, head, query_index) -> jax.Array:
    """Global dropout rows (b * N + n) * Q + q, <int32> wrapping like the uint32 XLA path, for
    local example ``batch``, head ``head`` and global query indices ``query_index``."""
    global_batch = params_ref[2] + batch
    global_head = params_ref[3] + head
    return (global_batch * plan.total_heads + global_head) * plan.total_queries + query_index


def apply_dropout(plan: Plan, params_ref, x, rows, cols):
    """``x`` with the tile's mask applied and kept elements rescaled (identity at rate 0)."""
    if not plan.dropout:
        return x
    seed = (params_ref[0], params_ref[1])
    keep = dropout_lib.keep_mask_tile(seed, plan.dropout_rate, rows, cols)
    scale = jnp.asarray(dropout_lib.keep_scale(plan.dropout_rate), x.dtype)
    return jnp.where(keep, x * scale, jnp.zeros((), x.dtype))


def _iota(shape, dim, start):
    return jax.lax.broadcasted_iota(jnp.int32, shape, dim) + start


def _unpack(refs, plan: Plan, num_inputs: int):
    """Split refs into (inputs, positions or None, the rest) around the optional positions."""
    inputs, rest = refs[:num_inputs], refs[num_inputs:]
    if plan.causal:
        return inputs, rest[0], rest[1:]
    return inputs, None, rest


def forward_kernel(*refs, plan: Plan):
    """Grid (B, N / hb, nq, nk). Online softmax over key blocks; writes the context and the
    per-row max and sum <float32>[hb, 2, bq] (rows as lanes, so the stats stay small in HBM)."""
    (needed, params, q_ref, k_ref, v_ref, code_ref), pos_ref, rest = _unpack(refs, plan, 6)
    o_ref, stats_ref, max_scr, sum_scr, acc_scr = rest
    b, head_block, qi, kj = (pl.program_id(i) for i in range(4))
    bq, bk = plan.block_q, plan.block_k

    @pl.when(kj == 0)
    def _init():
        max_scr[...] = jnp.full(max_scr.shape, -jnp.inf, jnp.float32)
        sum_scr[...] = jnp.zeros(sum_scr.shape, jnp.float32)
        acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

    @pl.when(kj < needed[b * plan.num_q_blocks + qi])
    def _step():
        q, k, v = q_ref[0], k_ref[0], v_ref[0]  # [bq, W], [bk, W], [bk, W]
        positions = None if pos_ref is None else pos_ref[0]  # [bq, 1]
        cols = _iota((1, bk), 1, kj * bk)
        bias = tile_bias(code_ref[0], cols, positions)  # [bq, bk]
        for h in range(plan.heads_per_block):
            lanes = head_lanes(plan, h)
            s = tile_scores(jnp.where(lanes, q, jnp.zeros((), q.dtype)), k, bias)
            max_prev, sum_prev = max_scr[h][:, :1], sum_scr[h][:, :1]  # [bq, 1]
            max_next = jnp.maximum(max_prev, s.max(axis=1, keepdims=True))
            alpha = jnp.exp(max_prev - max_next)
            unnormalized = jnp.exp(s - max_next)
            sum_next = alpha * sum_prev + unnormalized.sum(axis=1, keepdims=True)
            max_scr[h] = jnp.broadcast_to(max_next, (bq, _LANES))
            sum_scr[h] = jnp.broadcast_to(sum_next, (bq, _LANES))
            head = head_block * plan.heads_per_block + h
            rows = dropout_rows(plan, params, b, head, _iota((bq, 1), 0, qi * bq))
            p = apply_dropout(plan, params, unnormalized.astype(v.dtype), rows, cols)
            pv = jax.lax.dot(p, v, preferred_element_type=jnp.float32)  # [bq, W]
            acc = acc_scr[...]
            acc_scr[...] = jnp.where(lanes, acc * alpha + pv, acc)

    @pl.when(kj == plan.num_k_blocks - 1)
    def _finish():
        inverse = jnp.zeros((bq, plan.width), jnp.float32)
        for h in range(plan.heads_per_block):
            inverse = jnp.where(head_lanes(plan, h), 1.0 / sum_scr[h][:, :1], inverse)
            # [bq, 128] lane-replicated -> [128, bq]: one row holds the bq row stats.
            stats_ref[0, h, 0:1, :] = max_scr[h].T[0:1, :]
            stats_ref[0, h, 1:2, :] = sum_scr[h].T[0:1, :]
        o_ref[0] = (acc_scr[...] * inverse).astype(o_ref.dtype)


def dq_kernel(*refs, plan: Plan):
    """Grid (B, N / hb, nq, nk): dq = sum over key blocks of dS K, dS = P (dropout(dO V^T) - di).

    ``stats`` <float32>[hb, 3, bq] holds (max, 1 / sum, di = rowsum(dO * O)) per row."""
    inputs, pos_ref, (dq_ref, stats_scr, acc_scr) = _unpack(refs, plan, 8)
    needed, params, q_ref, k_ref, v_ref, do_ref, stats_ref, code_ref = inputs
    b, head_block, qi, kj = (pl.program_id(i) for i in range(4))
    bq, bk = plan.block_q, plan.block_k

    @pl.when(kj == 0)
    def _init():
        acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)
        for h in range(plan.heads_per_block):
            for stat in range(3):  # row [1, bq] -> lane-replicated column [bq, 128], once
                row = jnp.broadcast_to(stats_ref[0, h, stat : stat + 1, :], (_LANES, bq))
                stats_scr[h * 3 + stat] = row.T

    @pl.when(kj < needed[b * plan.num_q_blocks + qi])
    def _step():
        q, k, v, do = q_ref[0], k_ref[0], v_ref[0], do_ref[0]
        positions = None if pos_ref is None else pos_ref[0]  # [bq, 1]
        cols = _iota((1, bk), 1, kj * bk)
        bias = tile_bias(code_ref[0], cols, positions)  # [bq, bk]
        zero = jnp.zeros((), q.dtype)
        for h in range(plan.heads_per_block):
            lanes = head_lanes(plan, h)
            s = tile_scores(jnp.where(lanes, q, zero), k, bias)
            row_max, inverse_sum, di = (stats_scr[h * 3 + i][:, :1] for i in range(3))
            p = jnp.exp(s - row_max) * inverse_sum
            dp = jax.lax.dot_general(
                jnp.where(lanes, do, zero), v, _NT, preferred_element_type=jnp.float32
            )
            head = head_block * plan.heads_per_block + h
            rows = dropout_rows(plan, params, b, head, _iota((bq, 1), 0, qi * bq))
            dp = apply_dropout(plan, params, dp, rows, cols)
            ds = (p * (dp - di)).astype(k.dtype)
            dq = jax.lax.dot(ds, k, preferred_element_type=jnp.float32)  # [bq, W]
            acc = acc_scr[...]
            acc_scr[...] = jnp.where(lanes, acc + dq, acc)

    @pl.when(kj == plan.num_k_blocks - 1)
    def _finish():
        dq_ref[0] = acc_scr[...].astype(dq_ref.dtype)


def dkv_kernel(*refs, plan: Plan):
    """Grid (B, N / hb, nk, nq), transposed tiles [bk, bq] so the row stats broadcast over
    sublanes: dV = sum_q dropout(P)^T dO, dK = sum_q dS^T Q."""
    inputs, pos_ref, rest = _unpack(refs, plan, 8)
    needed, params, q_ref, k_ref, v_ref, do_ref, stats_ref, code_ref = inputs
    dk_ref, dv_ref, dk_scr, dv_scr = rest
    b, head_block, kj, qi = (pl.program_id(i) for i in range(4))
    bq, bk = plan.block_q, plan.block_k

    @pl.when(qi == 0)
    def _init():
        dk_scr[...] = jnp.zeros(dk_scr.shape, jnp.float32)
        dv_scr[...] = jnp.zeros(dv_scr.shape, jnp.float32)

    @pl.when(kj < needed[b * plan.num_q_blocks + qi])
    def _step():
        q, k, v, do = q_ref[0], k_ref[0], v_ref[0], do_ref[0]
        positions = None if pos_ref is None else pos_ref[0]  # [1, bq]
        cols = _iota((bk, 1), 0, kj * bk)  # key index, a column here
        bias = tile_bias(code_ref[0], cols, positions)  # [bk, bq]
        zero = jnp.zeros((), q.dtype)
        for h in range(plan.heads_per_block):
            lanes = head_lanes(plan, h)
            q_head, do_head = jnp.where(lanes, q, zero), jnp.where(lanes, do, zero)
            s = tile_scores(k, q_head, bias)  # [bk, bq]
            row_max, inverse_sum, di = (stats_ref[0, h, i : i + 1, :] for i in range(3))
            p = jnp.exp(s - row_max) * inverse_sum
            head = head_block * plan.heads_per_block + h
            rows = dropout_rows(plan, params, b, head, _iota((1, bq), 1, qi * bq))
            p_dropped = apply_dropout(plan, params, p.astype(do.dtype), rows, cols)
            dv_scr[...] += jax.lax.dot(p_dropped, do_head, preferred_element_type=jnp.float32)
            dp = jax.lax.dot_general(v, do_head, _NT, preferred_element_type=jnp.float32)
            dp = apply_dropout(plan, params, dp, rows, cols)
            ds = (p * (dp - di)).astype(q.dtype)
            dk_scr[...] += jax.lax.dot(ds, q_head, preferred_element_type=jnp.float32)

    @pl.when(qi == plan.num_q_blocks - 1)
    def _finish():
        dk_ref[0] = dk_scr[...].astype(dk_ref.dtype)
        dv_ref[0] = dv_scr[...].astype(dv_ref.dtype)
