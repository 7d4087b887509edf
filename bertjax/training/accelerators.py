"""The accelerators bertjax knows: one table of HBM, peak FLOP/s and cores per chip.

``python -m bertjax.compile`` reads it to say whether a config fits a TPU slice, and the training
log's MFU divides by its peak. ``peak_bf16_flops`` is the dense (no sparsity) bf16 matmul peak of
one chip, the figure vendors publish; ``hbm_bytes`` is the HBM of one chip; ``cores_per_chip``
counts TensorCores (v4 and v5p run their two as one "megacore" JAX device per chip). Sources: the
Cloud TPU system-architecture pages of each generation and NVIDIA's datasheets (SXM parts).

A JAX device is matched by its ``device_kind`` (e.g. ``"TPU v5 lite"``); CPUs have no entry, so
MFU on CPU needs ``config.train.peak_flops`` (see :func:`peak_flops_per_device`).
"""

from __future__ import annotations

import dataclasses

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str  # what users call it: the gcloud accelerator-type prefix for TPUs
    device_kinds: tuple[str, ...]  # jax Device.device_kind values that are this chip
    hbm_bytes: int
    peak_bf16_flops: float
    cores_per_chip: int
    platform: str  # 'tpu' | 'gpu'


CHIPS = (
    Chip("v2", ("TPU v2",), 16 * GIB, 45e12, 2, "tpu"),
    Chip("v3", ("TPU v3",), 32 * GIB, 123e12, 2, "tpu"),
    Chip("v4", ("TPU v4",), 32 * GIB, 275e12, 2, "tpu"),
    Chip("v5e", ("TPU v5 lite", "TPU v5e"), 16 * GIB, 197e12, 1, "tpu"),
    Chip("v5p", ("TPU v5", "TPU v5p"), 95 * GIB, 459e12, 2, "tpu"),
    Chip("v6e", ("TPU v6 lite", "TPU v6e"), 32 * GIB, 918e12, 1, "tpu"),
    Chip("A100", ("A100",), 80 * 10**9, 312e12, 1, "gpu"),
    Chip("H100", ("H100",), 80 * 10**9, 989e12, 1, "gpu"),
    Chip("H200", ("H200",), 141 * 10**9, 989e12, 1, "gpu"),
)


def chip_for_device_kind(device_kind: str) -> Chip | None:
    """The table's chip for a JAX ``device_kind``, or None (CPU, unknown devices).

    Exact names first, then substrings for GPUs (``"NVIDIA H100 80GB HBM3"``).
    """
    for chip in CHIPS:
        if device_kind in chip.device_kinds:
            return chip
    for chip in CHIPS:
        if chip.platform == "gpu" and any(k in device_kind for k in chip.device_kinds):
            return chip
    return None


def chip_by_name(name: str) -> Chip:
    for chip in CHIPS:
        if chip.name == name:
            return chip
    raise ValueError(f"unknown chip {name!r}; known: {[c.name for c in CHIPS]}")


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
