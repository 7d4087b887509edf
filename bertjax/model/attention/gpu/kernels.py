"""Pallas GPU (Triton) kernels of the fused attention: forward, dq, and dk/dv (``flash.py``).

Layouts are the model's own, [B, T, N, D] (D padded to a power of two, T to whole blocks): a
program reads one head's [block, D] rows with strided loads, so no transposes surround the
kernels. Tiles are [bq, bk], queries on rows; per-query stats are float32 [bq] vectors, stored
as <float32>[B, N, Qp] (max, sum) and, for the backward, di = rowsum(dO * O).

Each program owns one (example, head) and one query block (forward, dq: grid (B, N, nq), a loop
over its range of key blocks, ``key_blocks``) or one key block (dk/dv: grid (B, N, nk), a loop
over the range of query sub-blocks whose blocks visit it). Per tile it recomputes the
probabilities and the dropout mask with the tile math of ``attention/common.py``; every tile the
backward visits either was visited by the forward or holds only keys masked for rows with a real
maximum, so a recomputed ``s - m`` is never positive. ``key_blocks``, ``params``
(``common.kernel_inputs``) and the dk/dv kernel's query ranges are whole-array operands read with
scalar loads. No loop branches: Triton pipelines the loads of every loop.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from bertjax.model.attention.common import (
    PlanCounts,
    apply_keep,
    dropout_rows,
    keep_mask,
    tile_bias,
)

_NT = (((1,), (1,)), ((), ()))  # contract the last dims: [m, D] x [n, D] -> [m, n]
_TN = (((0,), (0,)), ((), ()))  # contract the first dims: [m, n] x [m, D] -> [n, D]


@dataclasses.dataclass(frozen=True)
class Plan(PlanCounts):
    """Static description of one fused-attention call (hashable: a custom_vjp static arg)."""

    batch: int  # local (per shard) B
    num_heads: int  # local N
    head_dim: int  # D padded to a power of two >= 16 (Triton's tile and dot minimum)
    block_q: int
    block_k: int
    padded_queries: int  # Qp
    padded_keys: int  # Lp
    causal: bool
    dropout_rate: float
    total_heads: int  # global N: the dropout row index is global
    total_queries: int  # global Q
    interpret: bool  # run on the host (CPU tests) instead of lowering to Triton
    # The dk/dv kernel walks the queries in sub-blocks of block_q_dkv rows (dividing block_q):
    # it holds dk, dv, k and v for its whole key block, so its per-query tiles must be smaller
    # to stay in registers.
    block_q_dkv: int = 32
    num_warps: int = 4
    num_stages: int = 2
    window: int | None = None  # a local layer's window (bertjax.model.attention.attention)


def _scores(q, k, bias) -> jax.Array:
    """<float32>[bq, bk] = q k^T + bias, accumulated in float32, for q <dtype>[bq, D], k [bk, D]."""
    return jax.lax.dot_general(q, k, _NT, preferred_element_type=jnp.float32) + bias


class _Tile:
    """Index vectors, bias and dropout mask of tile (qi, kj) of one (example, head) program."""

    def __init__(self, plan: Plan, params_ref, codes, positions, b, h, qi, kj, block_q=None):
        self.plan = plan
        block_q = block_q or plan.block_q
        self.queries = (qi * block_q + jnp.arange(block_q, dtype=jnp.int32))[:, None]
        self.keys = (kj * plan.block_k + jnp.arange(plan.block_k, dtype=jnp.int32))[None, :]
        code, query_code = codes  # [bk], [bq]
        query_positions = None if positions is None else positions[:, None]
        self.bias = tile_bias(code[None, :], query_code[:, None], self.keys, query_positions, plan)
        # One mask per tile, however many arrays it is applied to (None without dropout).
        rows = dropout_rows(plan, params_ref, b, h, self.queries) if plan.dropout else None
        self.keep = keep_mask(plan, params_ref, rows, self.keys)

    def dropout(self, x):
        """``x`` with the tile's mask applied and kept elements rescaled (identity at rate 0)."""
        return apply_keep(self.plan, self.keep, x)


def _blocks(plan: Plan, kj):
    return pl.ds(pl.multiple_of(kj * plan.block_k, plan.block_k), plan.block_k)


def _query_rows(qi, block):
    return pl.ds(pl.multiple_of(qi * block, block), block)


def _key_range(plan: Plan, key_blocks_ref, b, qi):
    """(first, end): the key blocks query block ``qi`` of example ``b`` visits."""
    at = 2 * (b * plan.num_q_blocks + qi)
    return key_blocks_ref[at], key_blocks_ref[at + 1]


def forward_kernel(*refs, plan: Plan):
    """Online softmax over the query block's key blocks; writes the context [bq, D] and the
    per-query max and sum <float32>[bq]."""
    key_blocks_ref, params_ref, q_ref, k_ref, v_ref, code_ref, query_code_ref, *rest = refs
    pos_ref, (o_ref, max_ref, sum_ref) = (
        (rest[0], rest[1:]) if plan.needs_positions else (None, rest)
    )
    b, h, qi = (pl.program_id(i) for i in range(3))
    q, query_code = q_ref[...], query_code_ref[...]
    positions = None if pos_ref is None else pos_ref[...]

    def step(kj, carry):
        acc, row_max, row_sum = carry
        keys = _blocks(plan, kj)
        tile = _Tile(plan, params_ref, (code_ref[keys], query_code), positions, b, h, qi, kj)
        k, v = k_ref[keys, :], v_ref[keys, :]
        s = _scores(q, k, tile.bias)
        max_next = jnp.maximum(row_max, s.max(axis=1))
        alpha = jnp.exp(row_max - max_next)
        unnormalized = jnp.exp(s - max_next[:, None])
        row_sum = alpha * row_sum + unnormalized.sum(axis=1)
        p = tile.dropout(unnormalized.astype(v.dtype))
        pv = jax.lax.dot(p, v, preferred_element_type=jnp.float32)  # [bq, D]
        return acc * alpha[:, None] + pv, max_next, row_sum

    init = (
        jnp.zeros((plan.block_q, plan.head_dim), jnp.float32),
        jnp.full((plan.block_q,), -jnp.inf, jnp.float32),
        jnp.zeros((plan.block_q,), jnp.float32),
    )
    acc, row_max, row_sum = jax.lax.fori_loop(*_key_range(plan, key_blocks_ref, b, qi), step, init)
    o_ref[...] = (acc * (1.0 / row_sum)[:, None]).astype(o_ref.dtype)
    max_ref[...] = row_max
    sum_ref[...] = row_sum


def _probabilities_and_ds(tile: _Tile, q, k, v, do, row_max, inverse_sum, di):
    """(p [bq, bk] float32, dS in dtype) of one tile: dS = P (dropout(dO V^T) - di)."""
    p = jnp.exp(_scores(q, k, tile.bias) - row_max[:, None]) * inverse_sum[:, None]
    dp = tile.dropout(jax.lax.dot_general(do, v, _NT, preferred_element_type=jnp.float32))
    return p, (p * (dp - di[:, None])).astype(q.dtype)


def dq_kernel(*refs, plan: Plan):
    """dq = sum over the query block's key blocks of dS K."""
    key_blocks_ref, params_ref, q_ref, k_ref, v_ref, do_ref, *rest = refs
    max_ref, sum_ref, di_ref, code_ref, query_code_ref, *rest = rest
    pos_ref, (dq_ref,) = (rest[0], rest[1:]) if plan.needs_positions else (None, rest)
    b, h, qi = (pl.program_id(i) for i in range(3))
    q, do, query_code = q_ref[...], do_ref[...], query_code_ref[...]
    stats = (max_ref[...], 1.0 / sum_ref[...], di_ref[...])
    positions = None if pos_ref is None else pos_ref[...]

    def step(kj, acc):
        keys = _blocks(plan, kj)
        tile = _Tile(plan, params_ref, (code_ref[keys], query_code), positions, b, h, qi, kj)
        k, v = k_ref[keys, :], v_ref[keys, :]
        _, ds = _probabilities_and_ds(tile, q, k, v, do, *stats)
        return acc + jax.lax.dot(ds, k, preferred_element_type=jnp.float32)

    init = jnp.zeros((plan.block_q, plan.head_dim), jnp.float32)
    dq = jax.lax.fori_loop(*_key_range(plan, key_blocks_ref, b, qi), step, init)
    dq_ref[...] = dq.astype(dq_ref.dtype)


def dkv_kernel(*refs, plan: Plan):
    """dV = sum_q dropout(P)^T dO and dK = sum_q dS^T Q over the query rows whose blocks need key
    block kj. ``query_range`` <int32>[B * nk * 2]: per (example, key block) the first and
    one-past-last query sub-block of ``block_q_dkv`` rows whose blocks visit it
    (``common.kernel_inputs``' ``query_blocks``). A sub-block in between whose block does not
    (gathered positions in no order, another instance) adds exactly 0: its rows' maxima are
    real logits and this key block holds only keys masked for them (a row with no allowed key
    visits every block). A loop without branches lets Triton pipeline its loads."""
    range_ref, params_ref, q_ref, k_ref, v_ref, do_ref, *rest = refs
    max_ref, sum_ref, di_ref, code_ref, query_code_ref, *rest = rest
    pos_ref, (dk_ref, dv_ref) = (rest[0], rest[1:]) if plan.needs_positions else (None, rest)
    b, h, kj = (pl.program_id(i) for i in range(3))
    k, v, code = k_ref[...], v_ref[...], code_ref[...]
    block = plan.block_q_dkv

    def step(qi, carry):  # qi: a sub-block of ``block`` rows
        dk, dv = carry
        queries = _query_rows(qi, block)
        positions = None if pos_ref is None else pos_ref[queries]
        codes = (code, query_code_ref[queries])
        tile = _Tile(plan, params_ref, codes, positions, b, h, qi, kj, block_q=block)
        q, do = q_ref[queries, :], do_ref[queries, :]
        stats = (max_ref[queries], 1.0 / sum_ref[queries], di_ref[queries])
        p, ds = _probabilities_and_ds(tile, q, k, v, do, *stats)
        p_dropped = tile.dropout(p.astype(do.dtype))
        dv = dv + jax.lax.dot_general(p_dropped, do, _TN, preferred_element_type=jnp.float32)
        dk = dk + jax.lax.dot_general(ds, q, _TN, preferred_element_type=jnp.float32)
        return dk, dv

    zeros = jnp.zeros((plan.block_k, plan.head_dim), jnp.float32)
    first = range_ref[(b * plan.num_k_blocks + kj) * 2]
    end = range_ref[(b * plan.num_k_blocks + kj) * 2 + 1]
    dk, dv = jax.lax.fori_loop(first, end, step, (zeros, zeros))
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)
