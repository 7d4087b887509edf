"""What the TPU and GPU flash-attention kernels share: their inputs, the tile math, the mesh.

Both kernels (``tpu/`` for Pallas TPU, ``gpu/`` for Pallas GPU/Triton) compute
``bertjax.model.attention``'s XLA path (``xla.py``) exactly, dropout included, from the same inputs
(:class:`KernelInputs`, made by :func:`kernel_inputs`):

* ``code`` <int32>[B, Lp]: per key, its sequence id (> 0: the instance of a real token), 0
  masked (padding), -1 padding past the true length L;
* ``query_code`` <int32>[B, Qp]: per query, its sequence id (the key mask at its position;
  0 for a padding position and for the padding past Q);
* ``positions`` <int32>[B, Qp]: each query's sequence position (for the causal mask and a local
  layer's window), padded;
* ``key_blocks`` <int32>[B * nq * 2]: per query block qi of example b, the key blocks
  [first, end) it visits, at 2 * (b * nq + qi). Key ``k`` is allowed for query ``q`` when
  ``code[k] > 0`` and (``code[k] == query_code[q]`` or ``query_code[q] == 0``) and, causal,
  ``k <= positions[q]``, with a window w, ``|k - positions[q]| <= w``: the package docstring's
  rule. A query's allowed keys lie within the span [first, last] of its instance's keys (of all
  real keys for id 0; within the window, if any, of its position), so a block outside the
  hull of its block's rows' spans holds only keys masked for rows with a real maximum, which
  add exactly 0: it is skipped. A row with no allowed key is uniform over all keys and needs
  every block; the padding past Q is left out (its rows are dropped). An unpacked row's range
  starts at block 0 and ends where the leading-block count it replaces ended. Sequence ids are
  at most L (1..k for k instances); an instance need not be contiguous (its span is then wider:
  more blocks visited, never a wrong result);
* ``query_blocks`` <int32>[B * nk * 2]: the mirror, per key block kj of example b: the query
  blocks [first, end) whose key range holds kj (0, 0: none), for the kernels that iterate over
  query blocks per key block (dk, dv). A query block inside it whose range misses kj is skipped
  (TPU) or adds exactly 0 (GPU, for the reason above);
* ``params`` <int32>[4] = (seed0, seed1, batch_offset, head_offset): the dropout seed's bits
  and, under a mesh, the shard's first global example and head.

Per tile a kernel recomputes, for the (query, key) pairs it owns,

    s = q . k + bias                      float32 (accumulated so, never rounded to dtype);
                                          bias (:func:`tile_bias`): 0 allowed, -1e9 masked,
                                          -inf padding key
    p = exp(s - m) / l                    m, l: per-query max and sum over all keys (forward)
    keep, scale = counter-hash dropout of the global (b, n, q, k)  (``dropout.py``)

which is the XLA path's arithmetic, so a tile's probabilities equal the [B, N, Q, L] array's.

A plan (each kernel family's own frozen dataclass, derived from :class:`PlanCounts`) provides
``batch, block_q, block_k, padded_queries, padded_keys, causal, dropout_rate, total_heads,
total_queries``: the names the functions here read.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from bertjax.model.attention import dropout as dropout_lib

MASK_VALUE = -1e9  # every path's additive mask (finite: an all-masked row is uniform)

# Names of the forward kernel's outputs, so a remat policy can keep them rather than re-run the
# kernel in the backward pass (``bertjax.model.encoder``'s 'dots_attention' / 'attention').
CHECKPOINT_NAMES = ("flash_context", "flash_stats")


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


class PlanCounts:
    """What a plan derives from its fields: block counts and whether dropout is on."""

    @property
    def num_q_blocks(self) -> int:
        return self.padded_queries // self.block_q

    @property
    def num_k_blocks(self) -> int:
        return self.padded_keys // self.block_k

    @property
    def dropout(self) -> bool:
        return dropout_lib.keep_threshold(self.dropout_rate) > 0

    @property
    def needs_positions(self) -> bool:
        """Whether the kernels read each query's position: for the causal mask or a window."""
        return self.causal or self.window is not None

    @property
    def visited_key_blocks(self) -> int:
        """At most how many key blocks a query block visits: all of them, or with a window the
        blocks that [first row - window, last row + window] can touch (``key_block_ranges``)."""
        if self.window is None:
            return self.num_k_blocks
        return min(self.num_k_blocks, (self.block_q + 2 * self.window - 1) // self.block_k + 2)


def sharded(
    fused, query, key, value, key_mask, *, mesh=None, batch_axes=(), head_axes=(), **kwargs
):
    """``fused(q, k, v, key_mask, query_positions, seed, offsets, total_heads=,
    total_queries=, **kwargs)`` over the whole arrays, or per shard of ``mesh``: a kernel
    family's public ``flash_attention``. Shapes, dtypes and ``kwargs`` as
    ``bertjax.model.attention.attention``: ``causal, query_positions, dropout_rate,
    dropout_seed``, and the family's own options (``block_q, block_k, interpret``). No seed
    means no dropout: ``fused`` then gets a zero seed and a rate of 0.

    With a mesh (concrete or abstract) the batch is split over mesh axes ``batch_axes`` and the
    heads over ``head_axes`` (sequences of mesh axis names, from the logical axis rules; may be
    empty): ``fused`` runs per shard under ``shard_map`` with the shard's global batch and head
    offsets (``axis_index``), so its dropout mask is the unsharded array's. The sequence axis is
    never split.
    """
    batch, num_queries, num_heads, _ = query.shape
    totals = dict(total_heads=num_heads, total_queries=num_queries)
    query_positions, seed = kwargs.pop("query_positions"), kwargs.pop("dropout_seed")
    if seed is None:
        seed, kwargs["dropout_rate"] = jnp.zeros(2, jnp.uint32), 0.0
    if mesh is None:
        offsets = jnp.zeros(2, jnp.int32)
        args = (query, key, value, key_mask, query_positions, seed, offsets)
        return fused(*args, **totals, **kwargs)
    if query_positions is None:  # what None means, made explicit: shard_map needs arrays
        query_positions = jnp.broadcast_to(
            jnp.arange(num_queries, dtype=jnp.int32), (batch, num_queries)
        )

    def shard(q, k, v, mask, positions, seed):
        batch_index = jax.lax.axis_index(batch_axes) if batch_axes else 0
        head_index = jax.lax.axis_index(head_axes) if head_axes else 0
        offsets = jnp.stack([batch_index * q.shape[0], head_index * q.shape[2]])
        return fused(q, k, v, mask, positions, seed, offsets.astype(jnp.int32), **totals, **kwargs)

    batch_spec, head_spec = batch_axes or None, head_axes or None
    qkv_spec, row_spec = P(batch_spec, None, head_spec, None), P(batch_spec, None)
    return jax.shard_map(
        shard,
        mesh=mesh,
        in_specs=(qkv_spec, qkv_spec, qkv_spec, row_spec, row_spec, P()),
        out_specs=qkv_spec,
        check_vma=False,  # pallas_call carries no varying-axes types
    )(query, key, value, key_mask, query_positions, seed)


class KernelInputs(NamedTuple):
    """The module docstring's kernel inputs of one (shard's) call."""

    code: jax.Array
    query_code: jax.Array
    positions: jax.Array
    key_blocks: jax.Array
    query_blocks: jax.Array
    params: jax.Array


def kernel_inputs(plan, key_mask, query_positions, seed, offsets, num_queries) -> KernelInputs:
    """The module docstring's inputs from the public arguments of one (shard's) call."""
    code = jnp.pad(
        jnp.maximum(key_mask.astype(jnp.int32), 0),
        ((0, 0), (0, plan.padded_keys - key_mask.shape[1])),
        constant_values=-1,
    )
    if query_positions is None:
        query_positions = jnp.broadcast_to(jnp.arange(num_queries), (plan.batch, num_queries))
    query_positions = query_positions.astype(jnp.int32)
    padding = ((0, 0), (0, plan.padded_queries - num_queries))
    query_code = jnp.pad(jnp.take_along_axis(code, query_positions, axis=1), padding)
    positions = jnp.pad(query_positions, padding)
    ranges = key_block_ranges(plan, code, query_code, positions, num_queries)
    if not plan.dropout:
        seed = jnp.zeros(2, jnp.uint32)
    seed = jax.lax.bitcast_convert_type(seed.astype(jnp.uint32), jnp.int32)
    params = jnp.concatenate([seed, offsets.astype(jnp.int32)])
    return KernelInputs(
        code,
        query_code,
        positions,
        ranges.reshape(-1),
        query_block_ranges(plan, ranges).reshape(-1),
        params,
    )


def _allowed_spans(plan, code, query_code, positions):
    """(first, last) <int32>[B, Qp]: the span of keys each query may attend to (last < first:
    none). Id > 0: its instance's first and last key; id 0: the first and last real key;
    causal: last clipped to the query's position."""
    batch, length = code.shape
    index = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), code.shape)
    ids = jnp.clip(code, 0, length)  # [B, Lp]; slot 0 collects masked and padding keys
    segments = (jnp.arange(batch)[:, None] * (length + 1) + ids).reshape(-1)
    bound = lambda reduce: reduce(
        index.reshape(-1), segments, num_segments=batch * (length + 1)
    ).reshape(batch, length + 1)
    instance_first, instance_last = bound(jax.ops.segment_min), bound(jax.ops.segment_max)
    real = jnp.where(code > 0, index, -1)
    first_real = jnp.where(code > 0, index, length).min(axis=1, keepdims=True)
    last_real = jnp.broadcast_to(real.max(axis=1, keepdims=True), positions.shape)
    if plan.causal:  # last real key at or before each position
        clipped = jnp.clip(positions, 0, length - 1)
        last_real = jnp.take_along_axis(jax.lax.cummax(real, axis=1), clipped, axis=1)
        last_real = jnp.where(positions < 0, -1, last_real)
    query_ids = jnp.clip(query_code, 0, length)
    own_first = jnp.take_along_axis(instance_first, query_ids, axis=1)
    own_last = jnp.take_along_axis(instance_last, query_ids, axis=1)
    if plan.causal:
        own_last = jnp.minimum(own_last, positions)
    packed = query_code > 0
    first = jnp.where(packed, own_first, jnp.broadcast_to(first_real, positions.shape))
    last = jnp.where(packed, own_last, last_real)
    if plan.window is not None:
        first = jnp.maximum(first, positions - plan.window)
        last = jnp.minimum(last, positions + plan.window)
    return first, last


def key_block_ranges(plan, code, query_code, positions, num_queries) -> jax.Array:
    """<int32>[B, nq, 2]: the key blocks [first, end) each query block visits (module
    docstring), from ``code`` [B, Lp], ``query_code`` and ``positions`` [B, Qp]."""
    first, last = _allowed_spans(plan, code, query_code, positions)
    none = last < first  # no allowed key: uniform over every key, so every block
    first_block = jnp.where(none, 0, first // plan.block_k)
    end_block = jnp.where(none, plan.num_k_blocks, last // plan.block_k + 1)
    real = jnp.arange(plan.padded_queries) < num_queries  # padding rows are dropped
    first_block = jnp.where(real, first_block, plan.num_k_blocks)
    end_block = jnp.where(real, end_block, 0)
    per_block = (plan.batch, plan.num_q_blocks, plan.block_q)
    first_block = first_block.reshape(per_block).min(axis=2)
    end_block = end_block.reshape(per_block).max(axis=2)
    return jnp.stack([first_block, end_block], axis=-1).astype(jnp.int32)


def query_block_ranges(plan, key_ranges) -> jax.Array:
    """<int32>[B, nk, 2]: per key block, the query blocks [first, end) whose key range
    ``key_ranges`` <int32>[B, nq, 2] holds it ((0, 0): none)."""
    kj = jnp.arange(plan.num_k_blocks)[None, None, :]
    hit = (key_ranges[..., :1] <= kj) & (kj < key_ranges[..., 1:])  # [B, nq, nk]
    first = jnp.argmax(hit, axis=1)
    end = plan.num_q_blocks - jnp.argmax(hit[:, ::-1], axis=1)
    any_hit = hit.any(axis=1)
    bounds = [jnp.where(any_hit, first, 0), jnp.where(any_hit, end, 0)]
    return jnp.stack(bounds, axis=-1).astype(jnp.int32)


def tile_bias(code, query_code, key_index, positions, plan) -> jax.Array:
    """Additive <float32> bias of a tile (the module docstring's rule) from broadcastable key
    codes (id > 0, 0 masked, -1 padding), query codes (ids, 0 padding), global key indices and
    query positions (None unless ``plan.needs_positions``): causal, keys at or before the
    position; with ``plan.window``, keys within it of the position."""
    allowed = (code > 0) & ((code == query_code) | (query_code <= 0))
    if plan.causal:
        allowed = allowed & (key_index <= positions)
    if plan.window is not None:
        allowed = allowed & (jnp.abs(key_index - positions) <= plan.window)
    masked = jnp.where(allowed, jnp.float32(0.0), jnp.float32(MASK_VALUE))
    # -inf, not -1e9: a padding key must add exactly 0 even to a row whose keys are all masked.
    return jnp.where(code < 0, jnp.float32(-jnp.inf), masked)


def dropout_rows(plan, params_ref, batch, head, query_index) -> jax.Array:
    """Global dropout rows (b * N + n) * Q + q, <int32> wrapping like the uint32 XLA path, for
    local example ``batch``, head ``head`` and global query indices ``query_index``."""
    global_batch = params_ref[2] + batch
    global_head = params_ref[3] + head
    return (global_batch * plan.total_heads + global_head) * plan.total_queries + query_index


def keep_mask(plan, params_ref, rows, cols):
    """<bool> keep mask of the tile at global dropout ``rows`` x key ``cols``; None at rate 0."""
    if not plan.dropout:
        return None
    seed = (params_ref[0], params_ref[1])
    return dropout_lib.keep_mask_tile(seed, plan.dropout_rate, rows, cols)


def apply_keep(plan, keep, x):
    """``x`` with ``keep`` applied and kept elements rescaled (identity for None)."""
    if keep is None:
        return x
    scale = jnp.asarray(dropout_lib.keep_scale(plan.dropout_rate), x.dtype)
    return jnp.where(keep, x * scale, jnp.zeros((), x.dtype))


def apply_dropout(plan, params_ref, x, rows, cols):
    """``x`` with the tile's mask applied and kept elements rescaled (identity at rate 0)."""
    return apply_keep(plan, keep_mask(plan, params_ref, rows, cols), x)
