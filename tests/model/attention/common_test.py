"""``common.sharded``: either kernel family under shard_map on 8 fake devices, the batch and the
heads split, equals the unsharded XLA path, dropout included (each shard draws the unsharded
array's mask from its global offsets)."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from bertjax.model.attention import gpu, tpu
from bertjax.training import sharding
from tests.model.attention import cases
from tests.model.attention.cases import Case


@pytest.mark.parametrize("flash_attention", [tpu.flash_attention, gpu.flash_attention])
def test_sharded_fused_equals_unsharded_xla_with_dropout(flash_attention):
    mesh = sharding.create_mesh((2, 2, 2))  # the model's ('data', 'fsdp', 'tensor') mesh
    case = Case(128, causal=True, rate=0.1, batch=4, heads=2, queries=24)
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
