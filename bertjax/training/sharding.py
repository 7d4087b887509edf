"""The device mesh and the logical -> mesh sharding: the runtime half of the sharding contract.

Contract (written once here and in ``bertjax.model.axes``, tested in
``tests/training/sharding_test.py``):

* Every parameter of the model carries logical axis names from ``bertjax.model.axes.PARAM_AXES``,
  every large activation is constrained with ``ACTIVATION_AXES``. No module names a mesh axis.
* The mesh has the axes ``MESH_AXES = ('data', 'fsdp', 'tensor')``. Their sizes come from config
  (``config.mesh.shape``; one entry may be -1 and is filled with the remaining devices).
* The mapping logical -> mesh axis lives only in config (``config.mesh.rules``), as a sequence of
  ``(logical_name, mesh_axis | tuple of mesh axes | None)`` pairs. ``DEFAULT_RULES`` below is the
  value ``configs/base.py`` uses: data parallel over ``data`` and ``fsdp`` for the batch, FSDP
  shards the ``embed`` dimension of weights, tensor parallel over heads/mlp/vocab.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import jax
import numpy as np
import optax
from flax import linen as nn
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bertjax.model import attention
from bertjax.model.axes import (
    ACT_BATCH,
    ACT_EMBED,
    ACT_HEADS,
    ACT_LENGTH,
    ACT_MLP,
    ACTIVATION_AXES,
    EMBED,
    HEADS,
    KV,
    LAYERS,
    MLP,
    PARAM_AXES,
    RNN,
    VOCAB,
)
from bertjax.model.config import BertConfig

MESH_AXES = ("data", "fsdp", "tensor")
# Mesh axes the batch dimension is split over (the host pipeline shards data over these).
BATCH_MESH_AXES = ("data", "fsdp")

DEFAULT_RULES = (
    (ACT_BATCH, BATCH_MESH_AXES),
    (ACT_LENGTH, None),
    (ACT_EMBED, None),
    (ACT_HEADS, "tensor"),
    (ACT_MLP, "tensor"),
    (VOCAB, "tensor"),
    (EMBED, "fsdp"),
    (HEADS, "tensor"),
    (KV, None),
    (MLP, "tensor"),
    (LAYERS, None),
    # A BiLSTM head's units stay whole: split, every time step would gather its state.
    (RNN, None),
)


def normalize_rules(rules) -> tuple[tuple[str, str | tuple[str, ...] | None], ...]:
    """Turns config rules (lists from ml_collections) into the tuples flax expects.

    Raises ValueError naming the offending rule when a logical or mesh axis is unknown.
    """
    out = []
    known = set(PARAM_AXES) | set(ACTIVATION_AXES)
    for rule in rules:
        if len(rule) != 2:
            raise ValueError(
                f"config.mesh.rules: expected (logical_axis, mesh_axes) pairs, got {rule!r}"
            )
        name, target = rule
        if name not in known:
            raise ValueError(
                f"config.mesh.rules: unknown logical axis {name!r}; known: {sorted(known)}"
            )
        if isinstance(target, list | tuple):
            target = tuple(target)
            bad = [t for t in target if t not in MESH_AXES]
        else:
            bad = [] if target is None or target in MESH_AXES else [target]
        if bad:
            raise ValueError(
                f"config.mesh.rules: {name!r} maps to unknown mesh axes {bad}; "
                f"mesh axes: {MESH_AXES}"
            )
        out.append((name, target))
    return tuple(out)


def resolve_mesh_shape(shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
    """Fills one -1 entry of ``shape`` so the product equals ``num_devices``."""
    shape = [int(s) for s in shape]
    if len(shape) != len(MESH_AXES):
        raise ValueError(
            f"config.mesh.shape must have {len(MESH_AXES)} entries {MESH_AXES}, got {shape}"
        )
    if shape.count(-1) > 1:
        raise ValueError(f"config.mesh.shape may contain at most one -1, got {shape}")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if num_devices % known:
            raise ValueError(
                f"config.mesh.shape {shape}: {num_devices} devices are not divisible by {known}"
            )
        shape[shape.index(-1)] = num_devices // known
    if math.prod(shape) != num_devices:
        raise ValueError(
            f"config.mesh.shape {shape} needs {math.prod(shape)} devices, "
            f"but {num_devices} are available"
        )
    return tuple(shape)


def create_mesh(shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``('data', 'fsdp', 'tensor')`` mesh over ``devices`` (default: all devices)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(shape, len(devices))
    try:
        device_array = mesh_utils.create_device_mesh(shape, devices)
    except Exception:  # noqa: BLE001 - CPU and odd topologies: plain row-major order is fine.
        device_array = np.asarray(devices).reshape(shape)
    return Mesh(device_array, MESH_AXES)


def logical_to_sharding(logical_specs, mesh: Mesh, rules):
    """Maps a pytree of logical ``PartitionSpec``s (or boxed params) to ``NamedSharding``s."""
    return nn.logical_to_mesh_sharding(logical_specs, mesh, normalize_rules(rules))


def optimizer_state_specs(tx, abstract_params, param_specs):
    """(abstract optimizer state, its logical PartitionSpecs): every per-parameter leaf (Adam
    moments, ...) takes its parameter's spec, everything else (counts) is replicated."""
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    specs = optax.tree_map_params(
        tx,
        lambda _, spec: spec,
        abstract_opt,
        param_specs,
        transform_non_params=lambda _: PartitionSpec(),
    )
    return abstract_opt, specs


def check_divisible(abstract_params, shardings, mesh: Mesh) -> None:
    """Raises ValueError, with the numbers, when a mesh axis does not divide the parameter
    dimension it splits (e.g. a vocab of 30522 over tensor=4): before anything is compiled."""
    flat = jax.tree_util.tree_leaves_with_path(abstract_params)
    for (path, leaf), sharding in zip(flat, jax.tree.leaves(shardings), strict=True):
        for size, axes in zip(leaf.shape, sharding.spec, strict=False):
            axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
            shards = math.prod(mesh.shape[a] for a in axes)
            if size % shards:
                raise ValueError(
                    f"config.mesh: parameter {jax.tree_util.keystr(path)} {leaf.shape} has a "
                    f"dimension of {size}, not divisible by the {shards} shards of mesh axes "
                    f"{axes} (config.mesh.shape={tuple(mesh.shape.values())}; pad the vocab "
                    "or change config.mesh.rules)"
                )


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Sharding of a host batch array: leading dim over the batch mesh axes, the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_MESH_AXES, *([None] * (ndim - 1))))


def num_batch_shards(mesh: Mesh) -> int:
    return math.prod(mesh.shape[a] for a in BATCH_MESH_AXES)


def batch_multiple(config, mesh: Mesh, process_count: int) -> int:
    """What every global train batch is a multiple of: the data shards x micro-batches
    (``train.grad_accum_steps``), and the process count."""
    return math.lcm(num_batch_shards(mesh) * int(config.train.grad_accum_steps), process_count)


def packed_batch_sizes(config, mesh: Mesh, process_count: int, instances_per_row: float,
                       unit: str = "instances", announce: bool = True):  # fmt: skip
    """The one resolver of packed batch sizes, for ``bertjax.main``, ``bertjax.compile``
    (``bertjax.pretrain.inputs.resolve_packed_batch``) and fine-tuning.

    With packed rows ``train.global_batch_size`` and ``train.eval_batch_size`` count instances
    (the paper's 256 sequences, fine-tuning's 32 examples), and so does a batch-size warm-up's
    ``train.batch_warmup_start``. -> a copy of ``config`` where they are the rows that hold that
    many on average, ``instances / instances_per_row``, rounded to a multiple of the data
    shards x micro-batches (``train.grad_accum_steps``) and of ``process_count``, at least one
    such multiple. ``announce``: print them (process 0), naming
    the ``unit`` the sizes count; ``unit='rows'`` (``train.batch_unit``, with
    ``instances_per_row`` 1) only rounds."""
    multiple = batch_multiple(config, mesh, process_count)
    resolved = config.copy_and_resolve_references()
    fields = ["global_batch_size", "eval_batch_size"]
    if float(config.train.get("batch_warmup_tokens", 0)) > 0:
        fields.append("batch_warmup_start")  # bertjax.training.batch_schedule
    for field in fields:
        rows = round(int(config.train[field]) / instances_per_row / multiple) * multiple
        resolved.train[field] = max(multiple, rows)
    if announce and jax.process_index() == 0 and unit == "rows":
        print(
            f"packing: train.batch_unit='rows': {resolved.train.global_batch_size} rows per "
            f"step, {resolved.train.eval_batch_size} per evaluation batch",
            flush=True,
        )
    elif announce and jax.process_index() == 0:
        print(
            f"packing: {instances_per_row:.3f} {unit} per row on average: "
            f"train.global_batch_size={config.train.global_batch_size} {unit} -> "
            f"{resolved.train.global_batch_size} rows per step, "
            f"train.eval_batch_size={config.train.eval_batch_size} -> "
            f"{resolved.train.eval_batch_size} rows",
            flush=True,
        )
    return resolved


def put_global(value, sharding) -> jax.Array:
    """A host value every process holds whole -> a global array in ``sharding`` (each process
    places only the shards of its own devices; works across processes, unlike device_put)."""
    value = np.asarray(value)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def make_global_batch(host_batch: dict, mesh: Mesh) -> dict:
    """The one host -> device boundary: this process's rows -> global arrays split over data."""
    return {
        k: jax.make_array_from_process_local_data(batch_sharding(mesh, np.ndim(v)), np.asarray(v))
        for k, v in host_batch.items()
    }


def bert_config_for(bert_config: BertConfig, mesh: Mesh) -> BertConfig:
    """``bert_config`` as a step on ``mesh`` runs it, fitted to the mesh's platform: the
    attention ask resolved into a kernel (``bertjax.model.attention.resolve``) and, on CPU, the
    XLA:CPU forms (``bertjax.model.cpu_forms``). Every step builder calls this; a TPU mesh gets
    the TPU forms even on a CPU host, as ``python -m bertjax.compile`` needs. Pure and
    idempotent: the run checks its fused kernel before (``bertjax.training.kernel_check``).
    ValueError for a kernel the platform cannot run."""
    platform = mesh.devices.flat[0].platform
    return bert_config.replace(
        attention_impl=attention.resolve(bert_config.attention_impl, platform),
        cpu_forms=platform == "cpu",
    )


@contextlib.contextmanager
def tracing_on(mesh: Mesh, rules):
    """What a step is traced and run inside: the mesh and the logical-axis rules."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(normalize_rules(rules)):
        yield
