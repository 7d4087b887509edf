"""The dispatch: which kernel an ask resolves to per platform, that the model then runs exactly
that kernel (cuDNN or the Pallas GPU kernel chosen per call from its dropout and dtype), and that
inside a step's tracing context a kernel runs per shard over the mesh axes of the logical rules,
equal to the unsharded XLA path."""

import jax
import jax.numpy as jnp
import pytest

from bertjax.model import attention
from bertjax.model.attention.gpu import cudnn
from bertjax.training import sharding
from tests.model.attention import cases
from tests.model.attention.cases import Case

RESOLVED = {  # (ask, platform) -> kernel
    ("auto", "tpu"): "tpu", ("auto", "gpu"): "gpu", ("auto", "cpu"): "xla",
    ("fused", "tpu"): "tpu", ("fused", "gpu"): "gpu", ("fused", "cpu"): "tpu_interpret",
    ("xla", "tpu"): "xla", ("xla", "gpu"): "xla", ("xla", "cpu"): "xla",
    ("tpu", "tpu"): "tpu", ("gpu", "gpu"): "gpu",
    ("tpu_interpret", "cpu"): "tpu_interpret", ("gpu_interpret", "tpu"): "gpu_interpret",
}  # fmt: skip


def test_resolve_picks_the_platforms_kernel_and_refuses_a_foreign_one():
    for (impl, platform), kernel in RESOLVED.items():
        assert attention.resolve(impl, platform) == kernel, (impl, platform)
    with pytest.raises(ValueError, match="attention_impl='tpu' runs on tpu only, not cpu"):
        attention.resolve("tpu", "cpu")
    with pytest.raises(ValueError, match="attention_impl='gpu' runs on gpu only, not tpu"):
        attention.resolve("gpu", "tpu")


def _traced(kernel: str, dtype, dropout: bool) -> str:
    q = jnp.zeros((2, 16, 2, 64), dtype)
    seed = jnp.zeros(2, jnp.uint32) if dropout else None
    fn = lambda q: attention.attention(
        q, q, q, jnp.ones((2, 16), jnp.int32), causal=False, query_positions=None,
        dropout_rate=0.1, dropout_seed=seed, kernel=kernel,
    )  # fmt: skip
    return str(jax.make_jaxpr(fn)(q))


@pytest.mark.parametrize(
    "kernel,dtype,dropout,runs",
    [
        ("xla", jnp.bfloat16, True, "xla"),
        ("auto", jnp.bfloat16, True, "xla"),  # an unresolved ask
        ("fused", jnp.float32, True, "xla"),
        ("tpu", jnp.bfloat16, True, "tpu"),
        ("tpu_interpret", jnp.float32, False, "tpu"),
        ("gpu", jnp.bfloat16, True, "gpu"),  # dropout: cuDNN cannot
        ("gpu", jnp.float32, False, "gpu"),  # float32: cuDNN cannot
        ("gpu", jnp.bfloat16, False, "cudnn"),
        ("gpu_interpret", jnp.bfloat16, False, "gpu"),
    ],
)
def test_the_model_runs_the_resolved_kernel(monkeypatch, kernel, dtype, dropout, runs):
    called = []
    # cuDNN cannot even be traced without a GPU: record the call instead.
    monkeypatch.setattr(cudnn, "cudnn_attention", lambda q, *_, **__: called.append(1) or q)
    jaxpr = _traced(kernel, dtype, dropout)
    pallas = "pallas_call" in jaxpr
    tpu = pallas and "dimension_semantics" in jaxpr  # Mosaic's compiler params, not Triton's
    ran = "cudnn" if called else "tpu" if tpu else "gpu" if pallas else "xla"
    assert ran == runs
    if runs in ("tpu", "gpu"):
        assert f"interpret={kernel.endswith('_interpret')}" in jaxpr


@pytest.mark.parametrize("kernel", ["tpu_interpret", "gpu_interpret"])
def test_model_dispatch_runs_the_kernel_per_shard_with_the_rules_axes(kernel):
    """attention(kernel=...) inside the step's tracing context: shard_map over the mesh axes
    the logical rules give act_batch and act_heads; equal to the unsharded XLA path."""
    mesh = sharding.create_mesh((2, 2, 2))
    case = Case(128, causal=False, rate=0.1, batch=4, heads=2)
    inputs, _, cotangent = cases.inputs(case)
    seed = cases.seed(case)
    with sharding.tracing_on(mesh, sharding.DEFAULT_RULES):
        jaxpr = str(jax.make_jaxpr(cases.dispatch(case, kernel))(*inputs, None, seed))
        got = cases.value_and_grads(cases.dispatch(case, kernel), inputs, None, cotangent, seed)
    assert "shard_map" in jaxpr and "pallas_call" in jaxpr
    assert "('data', 'fsdp')" in jaxpr and "'tensor'" in jaxpr
    want = cases.value_and_grads(cases.dispatch(case), inputs, None, cotangent, seed)
    cases.assert_close(got, want)
