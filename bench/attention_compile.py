"""Compiles attention forward + backward for a TPU with the real TPU compiler, on any machine.

No TPU needed: ``jax.experimental.topologies`` gives abstract v5e devices, and ``.compile()``
runs Mosaic (the Pallas kernels) and XLA:TPU. Nothing runs. Prints, per shape and
implementation, per-device figures: temp buffers by memory space (from XLA's buffer-assignment
dump: ``memory_analysis()`` reports 0 temp for topology-only compiles), XLA's cost analysis
(bytes accessed and flops; the kernels contribute their own cost estimates) and compile time.

    python bench/attention_compile.py
    python bench/attention_compile.py --topology=v5e:2x2 --batch=64

Shapes are BERT-base-like (global B, N heads of D = 64), bfloat16, attention dropout 0.1; the
batch is split over 'data' and the heads over 'tensor' of a ('data', 'fsdp', 'tensor') mesh
over the topology's chips. Inputs are <bf16>[B, L, N*D], as a dense layer writes them, and are
viewed as [B, L, N, D] inside. XLA:TPU's memory-space assignment may put temps in VMEM (128 MiB
on v5e), so the HBM column is what spills; bytes accessed counts both. libtpu's
TPU_ACCELERATOR_TYPE / TPU_WORKER_HOSTNAMES warnings are harmless.
"""

import os
import tempfile

DUMP_DIR = tempfile.mkdtemp(prefix="attention_compile_")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
# Compiling only: other processes (a test run, another compile) may hold libtpu too.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={DUMP_DIR} --xla_dump_hlo_module_re=.*loss.*"
)

import argparse  # noqa: E402
import glob  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from bertjax.model import attention  # noqa: E402
from bertjax.training import sharding  # noqa: E402

# (label, keys L, queries Q or None for Q = L, causal)
CASES = (
    ("L=512", 512, None, False),
    ("L=128", 128, None, False),
    ("L=512 Q=80 (MLM positions)", 512, 80, False),
    ("L=512 causal", 512, None, True),
)


_ALLOCATION = re.compile(r"^allocation \d+: size (\d+),(?: color (\d+),)? preallocated-temp", re.M)


def _mesh(topology: str) -> jax.sharding.Mesh:
    devices = topologies.get_topology_desc(topology_name=topology, platform="tpu").devices
    data = 2 if len(devices) % 2 == 0 else 1
    grid = np.asarray(devices).reshape(data, 1, len(devices) // data)
    return jax.sharding.Mesh(grid, ("data", "fsdp", "tensor"))


def _loss_and_grads(mesh, impl: str, causal: bool, with_positions: bool, num_heads: int):
    def loss(query, key, value, key_mask, positions, seed, d_context):
        heads = lambda x: x.reshape(*x.shape[:2], num_heads, -1)  # [B, T, N*D] -> [B, T, N, D]
        context = attention.attention(  # per (batch, heads) shard of the rules' mesh axes
            heads(query), heads(key), heads(value), key_mask, kernel=impl, causal=causal,
            query_positions=positions if with_positions else None,
            dropout_rate=0.1, dropout_seed=seed,
        )  # fmt: skip
        context = context.reshape(d_context.shape).astype(jnp.float32)
        return jnp.sum(context * d_context.astype(jnp.float32))

    return jax.value_and_grad(loss, argnums=(0, 1, 2))


def compile_case(mesh, impl, batch, heads, head_dim, length, queries, causal):
    """-> (compiled, seconds) for value_and_grad of the attention at these shapes."""
    queries = queries or length
    hidden = heads * head_dim
    # Heads are contiguous in the hidden axis, so splitting it over 'tensor' splits heads.
    flat = NamedSharding(mesh, P(("data", "fsdp"), None, "tensor"))
    rows = NamedSharding(mesh, P(("data", "fsdp"), None))
    bf16 = jnp.bfloat16
    args = (
        jax.ShapeDtypeStruct((batch, queries, hidden), bf16, sharding=flat),
        jax.ShapeDtypeStruct((batch, length, hidden), bf16, sharding=flat),
        jax.ShapeDtypeStruct((batch, length, hidden), bf16, sharding=flat),
        jax.ShapeDtypeStruct((batch, length), jnp.int32, sharding=rows),
        jax.ShapeDtypeStruct((batch, queries), jnp.int32, sharding=rows),
        jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=NamedSharding(mesh, P())),
        jax.ShapeDtypeStruct((batch, queries, hidden), bf16, sharding=flat),
    )
    fn = _loss_and_grads(mesh, impl, causal, queries != length, heads)
    start = time.perf_counter()
    jitted = jax.jit(fn, in_shardings=tuple(a.sharding for a in args), out_shardings=None)
    with sharding.tracing_on(mesh, sharding.DEFAULT_RULES):
        compiled = jitted.lower(*args).compile()
    return compiled, time.perf_counter() - start


def _temp_bytes(seen: set[str]) -> tuple[int, int]:
    """(HBM, VMEM) preallocated temp bytes of the module dumped since ``seen`` was taken."""
    paths = set(glob.glob(f"{DUMP_DIR}/*after_optimizations-buffer-assignment.txt")) - seen
    seen.update(paths)
    hbm = vmem = 0
    for path in paths:
        with open(path) as f:
            for size, color in _ALLOCATION.findall(f.read()):
                if not color:
                    hbm += int(size)
                elif color == "1":  # memory space 1: VMEM
                    vmem += int(size)
    return hbm, vmem


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="v5e:2x2")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head_dim", type=int, default=64)
    args = parser.parse_args()
    mesh = _mesh(args.topology)
    print(
        f"{args.topology}: mesh {dict(mesh.shape)}, global B={args.batch} N={args.heads} "
        f"D={args.head_dim} bf16, dropout 0.1, forward + backward; per-device figures"
    )
    print(
        f"{'case':<27} {'impl':<10} {'HBM temp MiB':>12} {'VMEM temp MiB':>13} "
        f"{'bytes accessed MiB':>18} {'GFLOP':>7} {'compile s':>9}"
    )
    seen: set[str] = set()
    for label, length, queries, causal in CASES:
        for impl in ("xla", "tpu"):
            compiled, seconds = compile_case(
                mesh, impl, args.batch, args.heads, args.head_dim, length, queries, causal
            )
            hbm, vmem = _temp_bytes(seen)
            cost = compiled.cost_analysis()
            cost = cost[0] if isinstance(cost, list) else cost
            print(
                f"{label:<27} {impl:<10} {hbm / 2**20:>12.1f} {vmem / 2**20:>13.1f} "
                f"{cost.get('bytes accessed', 0.0) / 2**20:>18.1f} "
                f"{cost.get('flops', 0.0) / 1e9:>7.2f} {seconds:>9.1f}"
            )


if __name__ == "__main__":
    main()
