"""What the TPU and GPU flash-attention kernels share: their inputs, the tile math, the mesh.

Both kernels (``tpu/`` for Pallas TPU, ``gpu/`` for Pallas GPU/Triton) compute
``bertjax.model.attention``'s XLA path (``xla.py``) exactly, dropout included, from the same inputs:

* ``code`` <int32>[B, Lp]: per key, 1 real, 0 masked, -1 padding (past the true length L);
* ``positions`` <int32>[B, Qp]: each query's sequence position (for the causal mask), padded;
* ``needed`` <int32>[B * nq]: how many leading key blocks query block qi of example b must
  visit (later blocks hold only masked keys, which add exactly 0);
* ``params`` <int32>[4] = (seed0, seed1, batch_offset, head_offset): the dropout seed's bits
  and, under a mesh, the shard's first global example and head.

Per tile a kernel recomputes, for the (query, key) pairs it owns,

    s = q . k + bias                      float32 (accumulated so, never rounded to dtype);
                                          bias: 0 allowed, -1e9 masked, -inf padding key
    p = exp(s - m) / l                    m, l: per-query max and sum over all keys (forward)
    keep, scale = counter-hash dropout of the global (b, n, q, k)  (``dropout.py``)

which is the XLA path's arithmetic, so a tile's probabilities equal the [B, N, Q, L] array's.

A plan (each kernel family's own frozen dataclass, derived from :class:`PlanCounts`) provides
``batch, block_q, block_k, padded_queries, padded_keys, causal, dropout_rate, total_heads,
total_queries``: the names the functions here read.
"""

from __future__ import annotations

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


def kernel_inputs(plan, key_mask, query_positions, seed, offsets, num_queries):
    """(code, positions, needed, params) of the module docstring for one (shard's) call."""
    code = jnp.pad(
        (key_mask != 0).astype(jnp.int32),
        ((0, 0), (0, plan.padded_keys - key_mask.shape[1])),
        constant_values=-1,
    )
    if query_positions is None:
        query_positions = jnp.broadcast_to(jnp.arange(num_queries), (plan.batch, num_queries))
    positions = jnp.pad(
        query_positions.astype(jnp.int32), ((0, 0), (0, plan.padded_queries - num_queries))
    )
    needed = _blocks_needed(plan, code, positions, num_queries)
    if not plan.dropout:
        seed = jnp.zeros(2, jnp.uint32)
    seed = jax.lax.bitcast_convert_type(seed.astype(jnp.uint32), jnp.int32)
    params = jnp.concatenate([seed, offsets.astype(jnp.int32)])
    return code, positions, needed, params


def _blocks_needed(plan, code, positions, num_queries) -> jax.Array:
    """<int32>[B * nq]: leading key blocks each query block must visit.

    A row with an allowed key gets exactly 0 from every key after its last allowed one (its
    max is a real logit, so exp(-1e9 + ...) underflows); a row with none is uniform over all
    keys and needs every block. Padding rows need only block 0 (they are dropped).
    """
    real = jnp.where(code == 1, jnp.arange(plan.padded_keys), -1)  # [B, Lp]
    if plan.causal:  # last real key at or before each position
        last_real_upto = jax.lax.cummax(real, axis=1)
        clipped = jnp.clip(positions, 0, plan.padded_keys - 1)
        last_allowed = jnp.take_along_axis(last_real_upto, clipped, axis=1)
        last_allowed = jnp.where(positions < 0, -1, last_allowed)
    else:
        last_allowed = jnp.broadcast_to(real.max(axis=1, keepdims=True), positions.shape)
    blocks = jnp.where(last_allowed < 0, plan.num_k_blocks, last_allowed // plan.block_k + 1)
    blocks = jnp.where(jnp.arange(plan.padded_queries) < num_queries, blocks, 1)
    return blocks.reshape(plan.batch * plan.num_q_blocks, plan.block_q).max(axis=1)


def tile_bias(code, key_index, positions) -> jax.Array:
    """Additive <float32> bias from broadcastable key codes (1 real, 0 masked, -1 padding),
    global key indices and query positions (None: bidirectional)."""
    allowed = code == 1
    if positions is not None:
        allowed = allowed & (key_index <= positions)
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
