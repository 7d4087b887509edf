"""The accelerators bertjax knows: one table of chips, and the TPU slices users rent.

``CHIPS``: per chip, the HBM XLA may use, HBM bandwidth, dense (no sparsity) bf16 peak FLOP/s and
TensorCores (v4 and v5p run their two as one "megacore" JAX device per chip). ``hbm_bytes`` is
what the TPU compiler allows a program (its out-of-memory messages: v4 30.75G, v5e 15.75G, v5p
95.74G, v6e 31.25G), a little under the datasheet's 32 GiB / 16 GB / 95 GB / 32 GB; GPUs list the
datasheet's. Sources: the Cloud TPU system-architecture pages of v4, v5e, v5p and v6e; NVIDIA's
A100/H100/H200 SXM datasheets. The training log's MFU divides by ``peak_bf16_flops`` (a device is
matched by its exact ``device_kind``, e.g. ``"TPU v5 lite"`` is v5e and ``"TPU v5"`` is v5p);
CPUs have no entry, so MFU on CPU needs ``config.train.peak_flops``.

``SLICES``: the accelerator types users type into gcloud (``v4-32``, ``v5litepod-16``,
``v5p-16``, ``v6e-8``; for v4/v5p the number counts TensorCores, for v5e/v6e chips) and the JAX
topology each is (``v4:2x2x4``: 16 chips on 4 hosts), for ``jax.experimental.topologies``.
:func:`slice_for` also accepts JAX's own names (``v5e:4x4``).
"""

from __future__ import annotations

import dataclasses
import math
import re

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str  # what users call it: v4, v5e, v5p, v6e, H100, ...
    device_kinds: tuple[str, ...]  # jax Device.device_kind values that are this chip
    hbm_bytes: int
    hbm_bytes_per_sec: float
    peak_bf16_flops: float
    cores_per_chip: int
    platform: str  # 'tpu' | 'gpu'

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity above which a step is bound by FLOPs, not HBM traffic."""
        return self.peak_bf16_flops / self.hbm_bytes_per_sec


CHIPS = (
    Chip("v2", ("TPU v2",), 16 * GIB, 700e9, 45e12, 2, "tpu"),
    Chip("v3", ("TPU v3",), 32 * GIB, 900e9, 123e12, 2, "tpu"),
    Chip("v4", ("TPU v4",), int(30.75 * GIB), 1228e9, 275e12, 2, "tpu"),
    Chip("v5e", ("TPU v5 lite", "TPU v5e"), int(15.75 * GIB), 819e9, 197e12, 1, "tpu"),
    Chip("v5p", ("TPU v5", "TPU v5p"), int(95.74 * GIB), 2765e9, 459e12, 2, "tpu"),
    Chip("v6e", ("TPU v6 lite", "TPU v6e"), int(31.25 * GIB), 1640e9, 918e12, 1, "tpu"),
    Chip("A100", ("A100",), 80 * 10**9, 2039e9, 312e12, 1, "gpu"),
    Chip("H100", ("H100",), 80 * 10**9, 3350e9, 989e12, 1, "gpu"),
    Chip("H200", ("H200",), 141 * 10**9, 4800e9, 989e12, 1, "gpu"),
)


@dataclasses.dataclass(frozen=True)
class Slice:
    name: str  # the gcloud accelerator type
    chip: Chip
    shape: tuple[int, ...]  # chips per torus axis: JAX's topology name is chip:AxBxC
    hosts: int

    @property
    def chips(self) -> int:
        return math.prod(self.shape)

    @property
    def topology_name(self) -> str:
        """For ``jax.experimental.topologies.get_topology_desc``."""
        return f"{self.chip.name}:{'x'.join(map(str, self.shape))}"

    def topology_options(self) -> dict:
        """get_topology_desc's other arguments: v4/v5p as one megacore device per chip; hosts of
        one chip, four chips (2x2) or eight (v5e/v6e 2x4)."""
        options: dict = {}
        if self.chip.cores_per_chip == 2:
            options["chip_config_name"] = "megacore"
        per_host = self.chips // self.hosts
        bounds = {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}[per_host]
        options["chips_per_host_bounds"] = bounds
        return options


def _slices() -> dict[str, Slice]:
    chip = {c.name: c for c in CHIPS}
    table = {}
    for cores, shape in ((8, (2, 2, 1)), (16, (2, 2, 2)), (32, (2, 2, 4)), (64, (2, 4, 4)),
                         (128, (4, 4, 4)), (256, (4, 4, 8)), (512, (4, 8, 8))):  # fmt: skip
        for generation in ("v4", "v5p"):
            table[f"{generation}-{cores}"] = Slice(
                f"{generation}-{cores}", chip[generation], shape, max(1, cores // 8)
            )
    for chips, shape, hosts in ((1, (1, 1), 1), (4, (2, 2), 1), (8, (2, 4), 1), (16, (4, 4), 4),
                                (32, (4, 8), 8), (64, (8, 8), 16), (128, (8, 16), 32),
                                (256, (16, 16), 64)):  # fmt: skip
        for prefix, generation in (("v5litepod", "v5e"), ("v6e", "v6e")):
            table[f"{prefix}-{chips}"] = Slice(f"{prefix}-{chips}", chip[generation], shape, hosts)
    return table


SLICES = _slices()


def slice_for(name: str) -> Slice:
    """A gcloud accelerator type (``v5litepod-16``) or a JAX topology name (``v5e:4x4``)."""
    if name in SLICES:
        return SLICES[name]
    match = re.fullmatch(r"(v4|v5e|v5p|v6e):(\d+(?:x\d+)*)", name)
    if match:
        shape = tuple(int(n) for n in match.group(2).split("x"))
        for known in SLICES.values():
            if known.chip.name == match.group(1) and known.shape == shape:
                return known
    raise ValueError(
        f"unknown TPU topology {name!r}; known: {', '.join(SLICES)} "
        "(or JAX's names, e.g. v5e:4x4, v4:2x2x4)"
    )


def chip_for_device_kind(device_kind: str) -> Chip | None:
    """The table's chip for a JAX ``device_kind``, or None (CPU, unknown devices).

    TPUs by exact name; GPUs by substring (``"NVIDIA H100 80GB HBM3"``).
    """
    for chip in CHIPS:
        if device_kind in chip.device_kinds:
            return chip
    for chip in CHIPS:
        if chip.platform == "gpu" and any(k in device_kind for k in chip.device_kinds):
            return chip
    return None


def peak_flops_per_device(configured: float, device_kind: str) -> tuple[float | None, str]:
    """(peak FLOP/s of one device or None, where it comes from): the denominator of MFU.

    ``configured`` (``config.train.peak_flops``) if > 0, else the table's dense bf16 peak for
    ``device_kind``, else None: no MFU (the log shows achieved FLOP/s instead).
    """
    if configured > 0:
        return float(configured), f"config.train.peak_flops = {configured:.4g} FLOP/s per device"
    chip = chip_for_device_kind(device_kind)
    if chip is None:
        return None, (
            f"no known peak for {device_kind!r} (set config.train.peak_flops to a per-device "
            "peak to see MFU)"
        )
    return chip.peak_bf16_flops, (
        f"dense bf16 peak of {chip.name}, {chip.peak_bf16_flops / 1e12:g} TFLOP/s per chip "
        "(bertjax.training.accelerators)"
    )
