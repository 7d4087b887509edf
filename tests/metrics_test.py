"""Host-side metrics: FLOPs model vs the standard transformer count, MFU, exact window means."""

import numpy as np

from bertjax import metrics
from bertjax.model import config_for_size


def test_flops_match_the_standard_count_with_full_bidirectional_attention():
    cfg = config_for_size("base")
    length, predictions = 128, 20
    h, f, v, layers = 768, 3072, cfg.vocab_size, 12
    # 6 x matmul params x tokens + 12 x layers x hidden x length^2 + gathered heads (PaLM-style).
    want = (
        6 * layers * (4 * h * h + 2 * h * f) * length
        + 12 * layers * h * length * length
        + 6 * (h * h + h * v) * predictions
        + 6 * (h * h + 2 * h)
    )
    assert metrics.train_flops_per_sequence(cfg, length, predictions) == want


def test_summaries_divide_sums_once():
    acc = metrics.Accumulator()
    acc.add(
        dict(
            steps=1,
            loss_sum=2.0,
            mlm_loss_sum=6.0,
            mlm_correct_sum=1.0,
            mlm_weight_sum=3.0,
            nsp_loss_sum=1.0,
            nsp_correct_sum=1.0,
            nsp_weight_sum=2.0,
            grad_norm_sum=1.0,
        )
    )
    acc.add(
        dict(
            steps=1,
            loss_sum=4.0,
            mlm_loss_sum=2.0,
            mlm_correct_sum=0.0,
            mlm_weight_sum=1.0,
            nsp_loss_sum=1.0,
            nsp_correct_sum=2.0,
            nsp_weight_sum=2.0,
            grad_norm_sum=3.0,
        )
    )
    values = metrics.summarize_train(
        acc.sums, 2.0, global_batch=4, length=8, flops_per_sequence=10.0, peak_flops_total=40.0
    )
    # Means over all masked positions of the window, not a mean of per-step means.
    np.testing.assert_allclose(values["mlm_loss"], 8.0 / 4.0)
    np.testing.assert_allclose(values["mlm_accuracy"], 1.0 / 4.0)
    np.testing.assert_allclose(values["nsp_accuracy"], 3.0 / 4.0)
    np.testing.assert_allclose(values["loss"], 3.0)
    np.testing.assert_allclose(values["sequences_per_sec"], 4.0)
    np.testing.assert_allclose(values["tokens_per_sec"], 32.0)
    np.testing.assert_allclose(values["mfu"], 4.0 * 10.0 / 40.0)
    line = metrics.format_train_line(10, 100, values, 1e-4, 3725.0)
    assert "mfu 100.0%" in line and "eta 1h02m05s" in line


def test_peak_flops_from_config_or_table():
    assert metrics.peak_flops_per_device(5e12) == 5e12
    assert metrics.peak_flops_per_device(0.0) is None  # CPU: unknown, MFU shown as n/a
