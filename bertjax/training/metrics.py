"""Host-side metrics: accumulating the step's sums, FLOPs/MFU, console lines, TensorBoard.

The train and eval steps return *sums* and *counts* (``bertjax.model.losses``); this module adds
them up over ``log_every`` steps and divides once on the host, so an average is exact regardless of
how many masked positions each batch had. MLM accuracy is MLPerf's: correct masked predictions /
weighted masked positions.

MFU = model FLOPs per second (``train_flops_per_sequence``: the matmuls the model computes,
bidirectional attention counted in full) / the devices' peak
(``bertjax.training.accelerators.peak_flops_per_device``: ``config.train.peak_flops``, else the
table's dense bf16 peak of a known TPU/GPU). On CPU, with no configured peak, the log shows the
achieved model GFLOP/s per device and no MFU.
"""

from __future__ import annotations

import time

import numpy as np

from bertjax.model.config import BertConfig


def train_flops_per_sequence(cfg: BertConfig, length: int, predictions: int) -> float:
    """Matmul FLOPs of forward + backward (3x forward) for one pretraining sequence.

    Bidirectional attention is counted in full (L x L scores and L x L x D context per head),
    even for the causal ablation; the MLM transform and tied decoder run on the P gathered
    positions only, as the model computes them, and so does the last layer when
    ``cfg.computes_only_output_positions``: its key/value projections at every position, its
    queries, attention, output projection and FFN at the Q = 1 + P positions the heads read.
    """
    h, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    per_token_layer = 2 * (4 * h * h + 2 * h * f)  # QKV + output projections, FFN
    attention_layer = 2 * 2 * length * length * h  # QK^T and PV
    encoder = cfg.num_layers * (length * per_token_layer + attention_layer)
    if cfg.computes_only_output_positions:
        queries = min(1 + predictions, length)
        last_layer = (
            length * 2 * (2 * h * h)  # key and value projections
            + queries * 2 * (2 * h * h + 2 * h * f)  # query and output projections, FFN
            + 2 * 2 * queries * length * h  # QK^T and PV for the Q queries
        )
        encoder += last_layer - (length * per_token_layer + attention_layer)
    heads = 2 * predictions * (h * h + h * v) + 2 * (h * h + 2 * h)  # MLM + pooler/NSP
    return 3.0 * (encoder + heads)


class Accumulator:
    """Sums metric dicts of numpy scalars; ``reset`` starts a new window."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.sums: dict[str, float] = {}
        self.start = time.perf_counter()

    def add(self, metrics: dict) -> None:
        for k, v in metrics.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else float("nan")


def summarize_train(
    sums: dict,
    seconds: float,
    *,
    global_batch: int,
    length: int,
    flops_per_sequence: float,
    num_devices: int,
    peak_flops_per_device: float | None,
) -> dict:
    """Window sums -> the scalars a user sees (means, rates, model FLOP/s per device, MFU)."""
    steps = sums["steps"]
    out = {
        "loss": _ratio(sums["loss_sum"], steps),
        "mlm_loss": _ratio(sums["mlm_loss_sum"], sums["mlm_weight_sum"]),
        "mlm_accuracy": _ratio(sums["mlm_correct_sum"], sums["mlm_weight_sum"]),
        "nsp_loss": _ratio(sums["nsp_loss_sum"], sums["nsp_weight_sum"]),
        "nsp_accuracy": _ratio(sums["nsp_correct_sum"], sums["nsp_weight_sum"]),
        "grad_norm": _ratio(sums["grad_norm_sum"], steps),
        "sequences_per_sec": _ratio(steps * global_batch, seconds),
    }
    out["tokens_per_sec"] = out["sequences_per_sec"] * length
    out["flops_per_device"] = out["sequences_per_sec"] * flops_per_sequence / num_devices
    if peak_flops_per_device:
        out["mfu"] = out["flops_per_device"] / peak_flops_per_device
    return out


def summarize_eval(sums: dict) -> dict:
    return {
        "mlm_loss": _ratio(sums["mlm_loss_sum"], sums["mlm_weight_sum"]),
        "mlm_accuracy": _ratio(sums["mlm_correct_sum"], sums["mlm_weight_sum"]),
        "nsp_loss": _ratio(sums["nsp_loss_sum"], sums["nsp_weight_sum"]),
        "nsp_accuracy": _ratio(sums["nsp_correct_sum"], sums["nsp_weight_sum"]),
        "sequences": sums["nsp_weight_sum"],
    }


def format_eta(seconds: float) -> str:
    if not np.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


def format_train_line(
    step: int, num_steps: int, values: dict, learning_rate: float, eta_seconds: float
) -> str:
    mfu = f" mfu {100 * values['mfu']:.1f}%" if "mfu" in values else ""
    return (
        f"step {step}/{num_steps} loss {values['loss']:.4f} "
        f"mlm_loss {values['mlm_loss']:.4f} mlm_acc {values['mlm_accuracy']:.4f} "
        f"nsp_loss {values['nsp_loss']:.4f} nsp_acc {values['nsp_accuracy']:.4f} "
        f"lr {learning_rate:.3g} grad_norm {values['grad_norm']:.3f} "
        f"seq/s {values['sequences_per_sec']:.1f} tok/s {values['tokens_per_sec']:.0f} "
        f"gflop/s/dev {values['flops_per_device'] / 1e9:.1f}{mfu} eta {format_eta(eta_seconds)}"
    )


class SummaryWriter:
    """TensorBoard scalars (tf.summary) under ``logdir``; a no-op on non-zero processes."""

    def __init__(self, logdir: str, enabled: bool):
        self._writer = None
        if enabled:
            import tensorflow as tf  # noqa: PLC0415 - only the writing process pays the import

            self._tf = tf
            self._writer = tf.summary.create_file_writer(logdir)

    def scalars(self, step: int, values: dict, prefix: str) -> None:
        if self._writer is None:
            return
        with self._writer.as_default():
            for k, v in values.items():
                self._tf.summary.scalar(f"{prefix}/{k}", float(v), step=step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
