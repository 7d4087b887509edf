"""``common.sharded``: either kernel family under shard_map on 8 fake devices, the batch and the
heads split, equals the unsharded XLA path, dropout included (each shard draws the unsharded
array's mask from its global offsets), packed rows too. ``common.kernel_inputs``' block ranges
against the brute-force hull of the XLA path's mask, their tile counts for a packed row against
a hand count, and the kernels never reading a skipped block."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from bertjax.model.attention import common, gpu, tpu, xla
from bertjax.training import sharding
from tests.model.attention import cases
from tests.model.attention.cases import Case


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("flash_attention", [tpu.flash_attention, gpu.flash_attention])
def test_sharded_fused_equals_unsharded_xla_with_dropout(flash_attention, packed):
    mesh = sharding.create_mesh((2, 2, 2))  # the model's ('data', 'fsdp', 'tensor') mesh
    case = Case(128, causal=True, rate=0.1, batch=4, heads=2, queries=24, packed=packed)
    inputs, positions, cotangent = cases.inputs(case)
    positions = jnp.asarray(positions)
    sharded_fn = cases.kernel_fn(
        flash_attention, case, mesh=mesh, batch_axes=("data", "fsdp"), head_axes=("tensor",),
        interpret=True,
    )  # fmt: skip
    qkv = NamedSharding(mesh, P(("data", "fsdp"), None, "tensor"))
    rows = NamedSharding(mesh, P(("data", "fsdp")))
    placed = [jax.device_put(x, qkv) for x in inputs[:3]] + [jax.device_put(inputs[3], rows)]
    seed = cases.seed(case)
    sharded = cases.value_and_grads(
        sharded_fn, placed, jax.device_put(positions, rows), cotangent, seed
    )
    xla = cases.value_and_grads(cases.dispatch(case), inputs, positions, cotangent, seed)
    cases.assert_close(sharded, xla)


@dataclasses.dataclass(frozen=True)
class _Plan(common.PlanCounts):
    """The plan fields ``common.kernel_inputs`` reads (module docstring of common.py)."""

    batch: int
    block_q: int
    block_k: int
    padded_queries: int
    padded_keys: int
    causal: bool
    dropout_rate: float = 0.0
    window: int | None = None


def _plan(key_mask, num_queries, causal, block_q, block_k, window=None):
    length = key_mask.shape[1]
    return _Plan(
        batch=key_mask.shape[0], block_q=block_q, block_k=block_k,
        padded_queries=common.round_up(num_queries, block_q),
        padded_keys=common.round_up(length, block_k), causal=causal, window=window,
    )  # fmt: skip


def _ranges(plan, key_mask, positions, num_queries):
    """(key_blocks <int32>[B, nq, 2], query_blocks [B, nk, 2]) as the kernels get them."""
    offsets, seed = jnp.zeros(2, jnp.int32), jnp.zeros(2, jnp.uint32)
    aux = common.kernel_inputs(plan, key_mask, positions, seed, offsets, num_queries)
    key_blocks = np.asarray(aux.key_blocks).reshape(plan.batch, plan.num_q_blocks, 2)
    query_blocks = np.asarray(aux.query_blocks).reshape(plan.batch, plan.num_k_blocks, 2)
    return key_blocks, query_blocks


def _hull_of_allowed_blocks(plan, key_mask, positions, num_queries):
    """The ranges from the XLA path's <bool>[B, 1, Q, L] mask, by brute force: per query block
    the smallest [first, end) holding every key block with a key allowed to one of its queries
    (every block when one of its queries has none); per key block the query blocks whose range
    holds it ((0, 0): none)."""
    allowed = np.asarray(xla.allowed_keys(key_mask, plan.causal, positions, plan.window))[:, 0]
    key_blocks = np.zeros((plan.batch, plan.num_q_blocks, 2), np.int32)
    for b in range(plan.batch):
        for qi in range(plan.num_q_blocks):
            rows = allowed[b, qi * plan.block_q : min((qi + 1) * plan.block_q, num_queries)]
            if not rows.any(axis=1).all():
                key_blocks[b, qi] = (0, plan.num_k_blocks)
                continue
            blocks = np.nonzero(rows.any(axis=0))[0] // plan.block_k
            key_blocks[b, qi] = (blocks.min(), blocks.max() + 1)
    query_blocks = np.zeros((plan.batch, plan.num_k_blocks, 2), np.int32)
    for b in range(plan.batch):
        for kj in range(plan.num_k_blocks):
            hits = [qi for qi, (lo, hi) in enumerate(key_blocks[b]) if lo <= kj < hi]
            query_blocks[b, kj] = (min(hits), max(hits) + 1) if hits else (0, 0)
    return key_blocks, query_blocks


@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("queries,shuffled", [(None, False), (40, False), (64, True)])
def test_block_ranges_are_the_hull_of_the_allowed_keys_blocks(
    packed, causal, queries, shuffled, window
):
    """key_blocks and query_blocks equal the brute-force hull of the XLA path's mask: no block
    holding an allowed key is skipped, and no block outside the hull is visited."""
    case = Case(200, causal=causal, rate=0.0, queries=queries, batch=4, shuffled=shuffled,
                packed=packed)  # fmt: skip
    (_, _, _, key_mask), positions, _ = cases.inputs(case)
    positions = None if positions is None else jnp.asarray(positions)
    num_queries = queries or 200
    plan = _plan(key_mask, num_queries, causal, block_q=32, block_k=16, window=window)
    got = _ranges(plan, key_mask, positions, num_queries)
    want = _hull_of_allowed_blocks(plan, key_mask, positions, num_queries)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_packed_rows_visit_only_their_instances_key_blocks():
    """Four instances of 64 tokens in a row of 256, blocks of 32: each query block visits its
    instance's 2 key blocks: 16 tiles instead of the unpacked row's 64 (causal: 12 instead of
    36), as many as the 4 instances alone would visit."""
    instances = np.repeat(np.arange(1, 5), 64)[None].astype(np.int32)
    unpacked = np.ones_like(instances)
    tiles = {}
    for name, key_mask in (("packed", instances), ("unpacked", unpacked)):
        for causal in (False, True):
            plan = _plan(key_mask, 256, causal, block_q=32, block_k=32)
            key_blocks, query_blocks = _ranges(plan, jnp.asarray(key_mask), None, 256)
            tiles[name, causal] = int((key_blocks[..., 1] - key_blocks[..., 0]).sum())
            # dk/dv visit the same (query block, key block) pairs, mirrored.
            assert int((query_blocks[..., 1] - query_blocks[..., 0]).sum()) == tiles[name, causal]
            if name == "unpacked":  # today's cost: every range starts at block 0
                assert (key_blocks[..., 0] == 0).all()
    assert tiles == {
        ("packed", False): 16, ("packed", True): 12, ("unpacked", False): 64,
        ("unpacked", True): 36,
    }  # fmt: skip


def test_a_window_visits_the_tiles_it_needs_and_the_cost_estimate_counts_them():
    """L = 8,192 in blocks of 512, ModernBERT's window (+-64): each query block visits 2 or 3
    key blocks (its own and the neighbours the window reaches), 46 tiles instead of 256: the
    work grows with the window, not with L. The TPU kernels' cost estimate (what XLA's cost
    analysis, and so ``bertjax.compile``, reports) counts the tiles a query block can visit."""
    from bertjax.model.attention.tpu import calls, flash  # noqa: PLC0415

    key_mask = jnp.ones((1, 8192), jnp.int32)
    tiles = {}
    for window in (None, 64):
        plan = _plan(key_mask, 8192, False, block_q=512, block_k=512, window=window)
        key_blocks, query_blocks = _ranges(plan, key_mask, None, 8192)
        tiles[window] = int((key_blocks[..., 1] - key_blocks[..., 0]).sum())
        assert int((query_blocks[..., 1] - query_blocks[..., 0]).sum()) == tiles[window]
    assert tiles == {None: 256, 64: 16 * 3 - 2}
    query = jnp.zeros((1, 8192, 12, 64), jnp.bfloat16)
    flops = {}
    for window in (None, 64):
        blocks = dict(block_q=512, block_k=512, total_heads=12, total_queries=8192)
        plan = flash._make_plan(query, query, causal=False, dropout_rate=0.0, window=window,
                                **blocks)  # fmt: skip
        cost = calls._cost(plan, 2, 1, [], [], 1)
        flops[window] = cost.flops
    assert flops[64] * 16 == flops[None] * 3  # 3 of 16 key blocks per query block at most


@pytest.mark.parametrize(
    "flash_attention,length,block",
    [(tpu.flash_attention, 256, 128), (gpu.flash_attention, 128, 32)],
)
def test_kernels_never_touch_key_blocks_of_other_instances(flash_attention, length, block):
    """Instance 1 fills exactly the first block; NaN in its queries, keys and values reaches no
    other instance's context or gradients through a kernel that skips its blocks (a kernel
    visiting them would spread NaN: NaN logits are not masked away). They equal the clean run."""
    ids = np.minimum(np.arange(length) // block + 1, 3)[None].astype(np.int32)
    case = Case(length, causal=False, rate=0.1, batch=1, heads=2)
    (query, key, value, _), _, cotangent = cases.inputs(case)
    poison = lambda x: x.at[:, :block].set(jnp.nan)
    fn = cases.kernel_fn(flash_attention, case, block_q=block, block_k=block, interpret=True)
    key_mask = jnp.asarray(ids)
    seed = cases.seed(case)
    clean = cases.value_and_grads(fn, (query, key, value, key_mask), None, cotangent, seed)
    poisoned_inputs = (poison(query), poison(key), poison(value), key_mask)
    poisoned = cases.value_and_grads(fn, poisoned_inputs, None, cotangent, seed)
    for got, want in zip(jax.tree.leaves(poisoned), jax.tree.leaves(clean), strict=True):
        assert np.isnan(np.asarray(got[:, :block])).all()
        np.testing.assert_array_equal(np.asarray(got[:, block:]), np.asarray(want[:, block:]))
