"""Pallas TPU kernels of the fused attention: forward, dq, and dk/dv (see ``flash.py``).

Layouts are feature-major, positions along lanes: queries <dtype>[B, N*D, Qp], keys and values
<dtype>[B, N*D, Lp] (Qp, Lp: padded to the block sizes). That is the layout the TPU compiler
itself gives the [B, T, N, D] projections for D = 64 (sequence minor, so no lane is padding),
so the transposes around the kernel are free. A grid step sees [W, block] slabs, W =
heads_per_block * D rows (one head when D is a whole number of sublane tiles), and every tile
it computes is transposed, [bk, bq]: keys on sublanes, queries on lanes. The per-query row
stats are then [1, bq] rows, the layout they have in HBM, and every product is a plain or a
last-dims-contracting MXU matmul except the two that contract D (s and dP, [D, bk]^T x [D, bq]).

Per tile every kernel recomputes the probabilities and the dropout mask of the (query, key)
pairs it owns, with the tile math of ``attention/common.py``. Scalar-prefetched operands:
``key_blocks``, ``query_blocks`` and ``params`` (``common.kernel_inputs``); a step runs when its
key block is in its query block's ``key_blocks`` range. Forward and backward visit the same
(query block, key block) pairs, so a recomputed ``s - m`` is never positive. With a single key
block (``backward_kernel``) every pair is visited.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from bertjax.model.attention.common import PlanCounts, apply_dropout, dropout_rows, tile_bias

_TN = (((0,), (0,)), ((), ()))  # contract the first dims: [D, m] x [D, n] -> [m, n]
_NT = (((1,), (1,)), ((), ()))  # contract the last dims: [m, W] x [n, W] -> [m, n]


@dataclasses.dataclass(frozen=True)
class Plan(PlanCounts):
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
    window: int | None = None  # a local layer's window (bertjax.model.attention.attention)

    @property
    def width(self) -> int:
        return self.heads_per_block * self.head_dim


def tile_scores(k, q, bias) -> jax.Array:
    """<float32>[bk, bq] = k^T q + bias, accumulated in float32, for k <dtype>[D, bk], q [D, bq]."""
    return jax.lax.dot_general(k, q, _TN, preferred_element_type=jnp.float32) + bias


def _iota(shape, dim, start):
    return jax.lax.broadcasted_iota(jnp.int32, shape, dim) + start


def _unpack(refs, plan: Plan, num_inputs: int):
    """Split refs into (inputs, positions or None, the rest) around the optional positions;
    ``inputs`` end with the key and query codes."""
    inputs, rest = refs[:num_inputs], refs[num_inputs:]
    if plan.needs_positions:
        return inputs, rest[0], rest[1:]
    return inputs, None, rest


def _visits(plan: Plan, key_blocks, b, qi, kj):
    """Whether query block ``qi`` of example ``b`` visits key block ``kj``."""
    at = 2 * (b * plan.num_q_blocks + qi)
    return (key_blocks[at] <= kj) & (kj < key_blocks[at + 1])


def _tile(plan: Plan, code_ref, query_code_ref, pos_ref, qi, kj):
    """(bias [bk, bq], key indices [bk, 1], query indices [1, bq]) of tile (qi, kj)."""
    keys = _iota((plan.block_k, 1), 0, kj * plan.block_k)
    queries = _iota((1, plan.block_q), 1, qi * plan.block_q)
    positions = None if pos_ref is None else pos_ref[0]  # [1, bq]
    return tile_bias(code_ref[0], query_code_ref[0], keys, positions, plan), keys, queries


def _heads(plan: Plan, head_block):
    """(global-in-shard head index, its rows of the block) for each head of the block."""
    d = plan.head_dim
    for h in range(plan.heads_per_block):
        yield head_block * plan.heads_per_block + h, slice(h * d, (h + 1) * d)


def forward_kernel(*refs, plan: Plan):
    """Grid (B, N / hb, nq, nk). Online softmax over key blocks; writes the context [W, bq] and
    the per-query max and sum <float32>[hb, 2, bq]."""
    inputs, pos_ref, rest = _unpack(refs, plan, 8)
    key_blocks, _, params, q_ref, k_ref, v_ref, code_ref, query_code_ref = inputs
    o_ref, stats_ref, max_scr, sum_scr, acc_scr = rest
    b, head_block, qi, kj = (pl.program_id(i) for i in range(4))

    @pl.when(kj == 0)
    def _init():
        max_scr[...] = jnp.full(max_scr.shape, -jnp.inf, jnp.float32)
        sum_scr[...] = jnp.zeros(sum_scr.shape, jnp.float32)
        acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

    @pl.when(_visits(plan, key_blocks, b, qi, kj))
    def _step():
        bias, keys, queries = _tile(plan, code_ref, query_code_ref, pos_ref, qi, kj)
        for h, (head, rows_of) in enumerate(_heads(plan, head_block)):
            q, k, v = q_ref[0, rows_of, :], k_ref[0, rows_of, :], v_ref[0, rows_of, :]
            s = tile_scores(k, q, bias)  # [bk, bq]
            max_prev, sum_prev = max_scr[h : h + 1, :], sum_scr[h : h + 1, :]  # [1, bq]
            max_next = jnp.maximum(max_prev, s.max(axis=0, keepdims=True))
            alpha = jnp.exp(max_prev - max_next)
            unnormalized = jnp.exp(s - max_next)
            sum_scr[h : h + 1, :] = alpha * sum_prev + unnormalized.sum(axis=0, keepdims=True)
            max_scr[h : h + 1, :] = max_next
            rows = dropout_rows(plan, params, b, head, queries)
            p = apply_dropout(plan, params, unnormalized.astype(v.dtype), rows, keys)
            pv = jax.lax.dot(v, p, preferred_element_type=jnp.float32)  # [D, bq]
            acc_scr[rows_of, :] = acc_scr[rows_of, :] * alpha + pv

    @pl.when(kj == plan.num_k_blocks - 1)
    def _finish():
        for h, (_, rows_of) in enumerate(_heads(plan, head_block)):
            row_sum = sum_scr[h : h + 1, :]
            o_ref[0, rows_of, :] = (acc_scr[rows_of, :] * (1.0 / row_sum)).astype(o_ref.dtype)
            stats_ref[0, h, 0:1, :] = max_scr[h : h + 1, :]
            stats_ref[0, h, 1:2, :] = row_sum


def _probabilities_and_ds(plan, params, refs_at, stats_ref, h, head, bias, keys, queries, b):
    """(p [bk, bq] float32, dropout(p) in dtype, dS in dtype) of one head's tile."""
    q, k, v, do = refs_at
    s = tile_scores(k, q, bias)
    row_max, inverse_sum, di = (stats_ref[0, h, i : i + 1, :] for i in range(3))  # [1, bq]
    p = jnp.exp(s - row_max) * inverse_sum
    rows = dropout_rows(plan, params, b, head, queries)
    dp = jax.lax.dot_general(v, do, _TN, preferred_element_type=jnp.float32)  # [bk, bq]
    dp = apply_dropout(plan, params, dp, rows, keys)
    ds = (p * (dp - di)).astype(q.dtype)
    return p, rows, ds


def dq_kernel(*refs, plan: Plan):
    """Grid (B, N / hb, nq, nk): dq = sum over key blocks of K dS, dS = P (dropout(dP) - di).

    ``stats`` <float32>[hb, 3, bq] holds (max, 1 / sum, di = rowsum(dO * O)) per query."""
    inputs, pos_ref, (dq_ref, acc_scr) = _unpack(refs, plan, 10)
    key_blocks, _, params, q_ref, k_ref, v_ref, do_ref, stats_ref, code_ref, query_code_ref = inputs
    b, head_block, qi, kj = (pl.program_id(i) for i in range(4))

    @pl.when(kj == 0)
    def _init():
        acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

    @pl.when(_visits(plan, key_blocks, b, qi, kj))
    def _step():
        bias, keys, queries = _tile(plan, code_ref, query_code_ref, pos_ref, qi, kj)
        for h, (head, rows_of) in enumerate(_heads(plan, head_block)):
            refs_at = tuple(r[0, rows_of, :] for r in (q_ref, k_ref, v_ref, do_ref))
            _, _, ds = _probabilities_and_ds(
                plan, params, refs_at, stats_ref, h, head, bias, keys, queries, b
            )
            k = refs_at[1]
            acc_scr[rows_of, :] += jax.lax.dot(k, ds, preferred_element_type=jnp.float32)

    @pl.when(kj == plan.num_k_blocks - 1)
    def _finish():
        dq_ref[0] = acc_scr[...].astype(dq_ref.dtype)


def dkv_kernel(*refs, plan: Plan):
    """Grid (B, N / hb, nk, nq): dV = sum_q dO dropout(P)^T, dK = sum_q Q dS^T over the query
    blocks that visit key block kj (the index maps fetch only ``query_blocks``' range)."""
    inputs, pos_ref, rest = _unpack(refs, plan, 10)
    key_blocks, _, params, q_ref, k_ref, v_ref, do_ref, stats_ref, code_ref, query_code_ref = inputs
    dk_ref, dv_ref, dk_scr, dv_scr = rest
    b, head_block, kj, qi = (pl.program_id(i) for i in range(4))

    @pl.when(qi == 0)
    def _init():
        dk_scr[...] = jnp.zeros(dk_scr.shape, jnp.float32)
        dv_scr[...] = jnp.zeros(dv_scr.shape, jnp.float32)

    @pl.when(_visits(plan, key_blocks, b, qi, kj))
    def _step():
        bias, keys, queries = _tile(plan, code_ref, query_code_ref, pos_ref, qi, kj)
        for h, (head, rows_of) in enumerate(_heads(plan, head_block)):
            refs_at = tuple(r[0, rows_of, :] for r in (q_ref, k_ref, v_ref, do_ref))
            q, _, _, do = refs_at
            p, rows, ds = _probabilities_and_ds(
                plan, params, refs_at, stats_ref, h, head, bias, keys, queries, b
            )
            p_dropped = apply_dropout(plan, params, p.astype(do.dtype), rows, keys)
            dv_scr[rows_of, :] += jax.lax.dot_general(
                do, p_dropped, _NT, preferred_element_type=jnp.float32
            )  # [D, bk]
            dk_scr[rows_of, :] += jax.lax.dot_general(
                q, ds, _NT, preferred_element_type=jnp.float32
            )

    @pl.when(qi == plan.num_q_blocks - 1)
    def _finish():
        dk_ref[0] = dk_scr[...].astype(dk_ref.dtype)
        dv_ref[0] = dv_scr[...].astype(dv_ref.dtype)


def backward_kernel(*refs, plan: Plan):
    """Grid (B, N / hb, 1, nq), for a single key block (Lp = bk, every BERT length): dq, dk and
    dv in one pass. A query block's dq needs no other key block, so it is written at its step;
    dk and dv accumulate over the query blocks. Reads the forward's (max, sum) <float32>[hb, 2,
    bq] and the context, and computes di = rowsum(dO * O) itself."""
    inputs, pos_ref, rest = _unpack(refs, plan, 11)
    _, _, params, q_ref, k_ref, v_ref, o_ref, do_ref, stats_ref, code_ref, query_code_ref = inputs
    dq_ref, dk_ref, dv_ref, dk_scr, dv_scr = rest
    b, head_block, kj, qi = (pl.program_id(i) for i in range(4))

    @pl.when(qi == 0)
    def _init():
        dk_scr[...] = jnp.zeros(dk_scr.shape, jnp.float32)
        dv_scr[...] = jnp.zeros(dv_scr.shape, jnp.float32)

    bias, keys, queries = _tile(plan, code_ref, query_code_ref, pos_ref, qi, kj)
    for h, (head, rows_of) in enumerate(_heads(plan, head_block)):
        q, k, v, do = (r[0, rows_of, :] for r in (q_ref, k_ref, v_ref, do_ref))
        o = o_ref[0, rows_of, :]
        di = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=0, keepdims=True)
        s = tile_scores(k, q, bias)  # [bk, bq]
        row_max, row_sum = stats_ref[0, h, 0:1, :], stats_ref[0, h, 1:2, :]
        p = jnp.exp(s - row_max) * (1.0 / row_sum)
        rows = dropout_rows(plan, params, b, head, queries)
        dp = jax.lax.dot_general(v, do, _TN, preferred_element_type=jnp.float32)
        dp = apply_dropout(plan, params, dp, rows, keys)
        ds = (p * (dp - di)).astype(q.dtype)
        dq = jax.lax.dot(k, ds, preferred_element_type=jnp.float32)  # [D, bq], whole
        dq_ref[0, rows_of, :] = dq.astype(dq_ref.dtype)
        p_dropped = apply_dropout(plan, params, p.astype(do.dtype), rows, keys)
        dv_scr[rows_of, :] += jax.lax.dot_general(
            do, p_dropped, _NT, preferred_element_type=jnp.float32
        )
        dk_scr[rows_of, :] += jax.lax.dot_general(q, ds, _NT, preferred_element_type=jnp.float32)

    @pl.when(qi == plan.num_q_blocks - 1)
    def _finish():
        dk_ref[0] = dk_scr[...].astype(dk_ref.dtype)
        dv_ref[0] = dv_scr[...].astype(dv_ref.dtype)
