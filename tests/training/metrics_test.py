"""Host-side metrics: FLOPs model vs the standard transformer count and a hand count, MFU,
exact window means, and the line without MFU when no peak is known."""

import numpy as np
import pytest

from bertjax.model.config import BertConfig
from bertjax.pretrain import objective
from bertjax.training import metrics
from tests.model.sizes import config_for_size


def test_flops_match_the_standard_count_with_full_bidirectional_attention():
    cfg = config_for_size("base", gather_last_layer=False)
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
            instances_sum=3.0,  # e.g. packed rows: 3 instances, 20 real tokens
            tokens_sum=20.0,
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
            instances_sum=1.0,
            tokens_sum=12.0,
        )
    )
    values = metrics.summarize_train(
        acc.sums,
        2.0,
        rows_per_step=4,
        tokens_per_row=8,
        flops_per_row=10.0,
        num_devices=2,
        peak_flops_per_device=20.0,
    )
    values.update(objective.summarize(acc.sums))
    # Means over all masked positions of the window, not a mean of per-step means.
    np.testing.assert_allclose(values["mlm_loss"], 8.0 / 4.0)
    np.testing.assert_allclose(values["mlm_accuracy"], 1.0 / 4.0)
    np.testing.assert_allclose(values["nsp_accuracy"], 3.0 / 4.0)
    np.testing.assert_allclose(values["loss"], 3.0)
    # Instances and real tokens learned from; FLOPs and MFU from the 2 x 4 rows computed.
    np.testing.assert_allclose(values["sequences_per_sec"], 4.0 / 2.0)
    np.testing.assert_allclose(values["tokens_per_sec"], 32.0 / 2.0)
    np.testing.assert_allclose(values["instances_per_step"], 2.0)
    np.testing.assert_allclose(values["tokens_per_step"], 16.0)
    np.testing.assert_allclose(values["mfu"], 4.0 * 10.0 / 40.0)
    line = metrics.format_train_line(10, 100, values, 1e-4, 3725.0, objective.SHORT_NAMES)
    assert line == (
        "step 10/100 loss 3.0000 mlm_loss 2.0000 mlm_acc 0.2500 nsp_loss 0.5000 nsp_acc 0.7500 "
        "lr 0.0001 grad_norm 2.000 seq/s 2.0 tok/s 16 inst/step 2.0 tok/step 16 gflop/s/dev 0.0 "
        "mfu 100.0% eta 1h02m05s"
    )
    line = metrics.format_train_line(10, 100, {**values, "input_wait": 0.125}, 1e-4, 3725.0)
    assert line.endswith(" mfu 100.0% input_wait 12.5% eta 1h02m05s"), line
    host = {"input_wait": 0.125, "host_rate": 33712.4, "host_cores": 0.5}
    line = metrics.format_train_line(10, 100, {**values, **host}, 1e-4, 3725.0)
    assert line.endswith(" input_wait 12.5% host 33.7k/s/core eta 1h02m05s"), line


def test_host_rate_is_rows_per_second_of_pipeline_work(monkeypatch):
    """host_rate = the window's host rows / the host_seconds their batches carried; host_cores =
    those seconds per second of the window; one batch without host_seconds drops both."""
    clock = iter([100.0, 104.0])  # the window starts at 100 s and is read at 104 s
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: next(clock))
    acc = metrics.Accumulator()
    for seconds in (0.5, 1.5):
        acc.add_host_batch(np.float32(seconds), {"input_ids": np.zeros((8, 4))})
    rates = acc.host_rates()
    assert rates == {"host_rate": 16 / 2.0, "host_cores": 2.0 / 4.0}
    acc.add_host_batch(None, {"input_ids": np.zeros((8, 4))})
    assert acc.host_rates() == {}


@pytest.mark.parametrize("attention", ["bidirectional", "causal"])
@pytest.mark.parametrize("gather_last_layer", [False, True])
def test_mfu_against_a_hand_count_of_every_matmul(attention, gather_last_layer):
    """A BERT small enough to list its matmuls by hand; attention counted in full (L x L) even
    for the causal ablation, MLM head on the P gathered positions only, and the last layer's
    queries onwards on [CLS] + the P positions when it is gathered."""
    cfg = BertConfig(
        vocab_size=10,
        hidden_size=8,
        num_layers=2,
        num_heads=2,  # head size 4
        intermediate_size=16,
        max_position_embeddings=8,
        attention=attention,
        gather_last_layer=gather_last_layer,
    )
    length, predictions = 4, 2
    # Forward FLOPs of one sequence, 2 * rows * contraction * columns per matmul:
    query_key_value = 3 * 2 * 4 * 8 * 8  # [L,H] x [H,H], three times: 1536
    scores = 2 * (2 * 4 * 4 * 4)  # per head [L,4] x [4,L]: 256
    context = 2 * (2 * 4 * 4 * 4)  # per head [L,L] x [L,4]: 256
    attention_output = 2 * 4 * 8 * 8  # 512
    feed_forward = 2 * 4 * 8 * 16 + 2 * 4 * 16 * 8  # 2048
    layer = query_key_value + scores + context + attention_output + feed_forward  # 4608
    # The last layer at Q = 3 rows ([CLS] + P): keys/values still at all L = 4 positions.
    last_gathered = (
        2 * 2 * 4 * 8 * 8  # key, value: 1024
        + 2 * 3 * 8 * 8  # query: 384
        + 2 * (2 * 3 * 4 * 4) * 2  # per head [Q,4] x [4,L] and [Q,L] x [L,4]: 384
        + 2 * 3 * 8 * 8  # attention output: 384
        + 2 * 3 * 8 * 16 * 2  # feed-forward: 1536
    )  # 3712
    mlm = 2 * 2 * 8 * 8 + 2 * 2 * 8 * 10  # transform + tied decoder on P=2 rows: 576
    pooler_nsp = 2 * 1 * 8 * 8 + 2 * 1 * 8 * 2  # [CLS] row only: 160
    forward = layer + (last_gathered if gather_last_layer else layer) + mlm + pooler_nsp
    assert forward == (9056 if gather_last_layer else 9952)
    flops = metrics.train_flops_per_sequence(cfg, length, predictions)
    assert flops == 3 * forward  # backward = 2x forward
    # 3 steps of global batch 4 in 2 s on 2 devices of 1e5 FLOP/s: 6 seq/s * flops / 2e5.
    sums = dict.fromkeys(
        ["loss_sum", "mlm_loss_sum", "mlm_correct_sum", "mlm_weight_sum", "grad_norm_sum"], 1.0
    )
    sums.update(nsp_loss_sum=1.0, nsp_correct_sum=1.0, nsp_weight_sum=1.0, steps=3.0)
    values = metrics.summarize_train(
        sums,
        2.0,
        rows_per_step=4,
        tokens_per_row=4,
        flops_per_row=flops,
        num_devices=2,
        peak_flops_per_device=1e5,
    )
    np.testing.assert_allclose(values["flops_per_device"], 6 * 3 * forward / 2)
    np.testing.assert_allclose(values["mfu"], 6 * 3 * forward / 2e5)
    # Scanned layers run the last layer in full whatever gather_last_layer says.
    scanned = cfg.replace(scan_layers=True)
    assert metrics.train_flops_per_sequence(scanned, length, predictions) == 3 * 9952


def test_line_shows_flops_per_device_and_mfu_only_with_a_peak():
    sums = dict.fromkeys(
        ["loss_sum", "mlm_loss_sum", "mlm_correct_sum", "mlm_weight_sum", "grad_norm_sum"], 1.0
    )
    sums.update(nsp_loss_sum=1.0, nsp_correct_sum=1.0, nsp_weight_sum=1.0, steps=1.0)
    common = dict(rows_per_step=2, tokens_per_row=4, flops_per_row=5e9, num_devices=1)
    without = metrics.summarize_train(sums, 1.0, **common, peak_flops_per_device=None)
    line = metrics.format_train_line(1, 10, without, 1e-4, 9.0)
    assert "gflop/s/dev 10.0" in line and "mfu" not in line and "mfu" not in without
    with_peak = metrics.summarize_train(sums, 1.0, **common, peak_flops_per_device=1e11)
    assert "mfu 10.0%" in metrics.format_train_line(1, 10, with_peak, 1e-4, 9.0)
