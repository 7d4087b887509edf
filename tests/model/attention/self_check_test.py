"""The self-check passes the kernels as they are and fails a kernel that is wrong by a little:
its output scaled by 1.001, its dropout mask drawn from another seed, or packed instances
seeing each other (on CPU: the Pallas
kernels in interpret mode against the XLA path)."""

import pytest

from bertjax.model.attention import gpu, self_check, tpu


@pytest.mark.parametrize(
    "kernel,dtype,causal",
    [("tpu_interpret", "float32", False), ("tpu_interpret", "bfloat16", True),
     ("gpu_interpret", "float32", True)],
)  # fmt: skip
def test_the_kernels_pass(kernel, dtype, causal):
    outcome = self_check.compare(kernel, head_dim=64, dtype=dtype, dropout_rate=0.1, causal=causal)
    assert outcome.passed, outcome.describe()
    assert {d.output for d in outcome.differences} == set(self_check.OUTPUTS)
    assert all(d.dropout for d in outcome.differences)  # the run's rate, dropout on


def _scaled(flash_attention, factor):
    return lambda *args, **kwargs: flash_attention(*args, **kwargs) * factor


def _reseeded(flash_attention):
    def wrong(*args, dropout_seed, **kwargs):
        return flash_attention(*args, dropout_seed=dropout_seed ^ 1, **kwargs)

    return wrong


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_slightly_scaled_kernel_fails_naming_the_largest_difference(monkeypatch, dtype):
    factor = 1.001 if dtype == "float32" else 1.02  # a bf16 ulp is 0.8%
    monkeypatch.setattr(tpu, "flash_attention", _scaled(tpu.flash_attention, factor))
    outcome = self_check.compare(
        "tpu_interpret", head_dim=32, dtype=dtype, dropout_rate=0.1, causal=False
    )
    assert not outcome.passed
    worst = outcome.worst
    assert worst.kernel_error > worst.allowed
    assert outcome.describe().startswith(
        f"{worst.output} with dropout at L=128, 128 queries, differs from the float32 truth by"
    )
    assert outcome.to_dict()["passed"] is False


def test_a_kernel_with_another_dropout_mask_fails(monkeypatch):
    monkeypatch.setattr(gpu, "flash_attention", _reseeded(gpu.flash_attention))
    outcome = self_check.compare(
        "gpu_interpret", head_dim=64, dtype="float32", dropout_rate=0.1, causal=False
    )
    assert not outcome.passed, outcome.describe()
    assert outcome.worst.ratio > 10  # not a rounding matter


def _unpacking(flash_attention):
    def wrong(query, key, value, key_mask, **kwargs):  # sequence ids read as a 1/0 mask
        return flash_attention(query, key, value, (key_mask > 0).astype(key_mask.dtype), **kwargs)

    return wrong


def test_a_kernel_that_lets_packed_instances_see_each_other_fails(monkeypatch):
    monkeypatch.setattr(gpu, "flash_attention", _unpacking(gpu.flash_attention))
    outcome = self_check.compare(
        "gpu_interpret", head_dim=32, dtype="float32", dropout_rate=0.1, causal=True
    )
    assert not outcome.passed, outcome.describe()
    assert outcome.worst.ratio > 10


def test_a_windowed_run_checks_its_local_calls_and_a_kernel_ignoring_the_window_fails(
    monkeypatch,
):
    """A model with local layers is checked at its window beside the global call; a kernel that
    drops the window passes the global call and fails the windowed one, named in its line."""
    shapes = self_check.Shapes(length=384, packed=0, window=50)
    outcome = self_check.compare("tpu_interpret", head_dim=64, dtype="float32",
                                 dropout_rate=0.1, causal=False, shapes=shapes)  # fmt: skip
    assert outcome.passed, outcome.describe()
    assert {d.window for d in outcome.differences} == {0, 50}
    assert outcome.to_dict()["window"] == 50

    def windowless(*args, window=None, **kwargs):
        return flash(*args, **kwargs)

    flash = tpu.flash_attention
    monkeypatch.setattr(tpu, "flash_attention", windowless)
    outcome = self_check.compare("tpu_interpret", head_dim=64, dtype="float32",
                                 dropout_rate=0.1, causal=False, shapes=shapes)  # fmt: skip
    assert not outcome.passed
    assert {d.window for d in outcome.differences if d.ratio > 1} == {50}
    assert ", window 50, differs from the float32 truth" in outcome.describe()
