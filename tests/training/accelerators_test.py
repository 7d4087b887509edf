"""The accelerator table: device kinds resolve to their chip, MFU's peak comes from config or the
table, and CPUs get no peak (no MFU) rather than a guess."""

import jax

from bertjax.training import accelerators


def test_device_kinds_resolve_to_their_chip():
    cases = {
        "TPU v4": "v4",
        "TPU v5 lite": "v5e",
        "TPU v5": "v5p",
        "TPU v6 lite": "v6e",
        "NVIDIA H100 80GB HBM3": "H100",
        "NVIDIA H200": "H200",
    }
    for kind, name in cases.items():
        assert accelerators.chip_for_device_kind(kind).name == name, kind
    assert accelerators.chip_for_device_kind("cpu") is None


def test_peak_flops_from_config_or_table_and_none_on_cpu():
    peak, source = accelerators.peak_flops_per_device(5e12, "cpu")
    assert peak == 5e12 and "config.train.peak_flops" in source
    peak, source = accelerators.peak_flops_per_device(0.0, "TPU v5 lite")
    assert peak == 197e12 and "v5e" in source
    peak, source = accelerators.peak_flops_per_device(0.0, jax.devices()[0].device_kind)
    assert peak is None and "config.train.peak_flops" in source  # tests run on CPU devices
