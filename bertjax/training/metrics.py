"""Host-side metrics: accumulating the step's sums, FLOPs/MFU, the console line, TensorBoard.

The train and eval steps return *sums* and *counts* (``bertjax.training.step``); this module adds
them up over ``log_every`` steps and divides once on the host, so an average is exact regardless
of how many masked positions or labelled tokens each batch had. The objective's own means (MLM
and NSP loss and accuracy, ``bertjax.pretrain.objective``) are divided the same way.

One line format serves pretraining and fine-tuning (:func:`format_train_line`), and one
TensorBoard writer (clu's, :func:`summary_writer`).

MFU = model FLOPs per second (``train_flops_per_sequence``: the matmuls the model computes,
bidirectional attention counted in full; ``encoder_flops`` for fine-tuning) / the devices' peak
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
    ffn = _ffn_matrices(cfg) * h * f
    per_token_layer = 2 * (4 * h * h + ffn)  # QKV + output projections, FFN
    attention_layer = 2 * 2 * length * length * h  # QK^T and PV
    encoder = encoder_flops(cfg, length)
    if cfg.computes_only_output_positions:
        queries = min(1 + predictions, length)
        last_layer = (
            length * 2 * (2 * h * h)  # key and value projections
            + queries * 2 * (2 * h * h + ffn)  # query and output projections, FFN
            + 2 * 2 * queries * length * h  # QK^T and PV for the Q queries
        )
        encoder += last_layer - (length * per_token_layer + attention_layer)
    heads = 2 * predictions * (h * h + h * v) + 2 * (h * h + 2 * h)  # MLM + pooler/NSP
    return 3.0 * (encoder + heads)


def encoder_flops(cfg: BertConfig, length: int) -> float:
    """Forward matmul FLOPs of the encoder at every one of ``length`` positions."""
    h, f = cfg.hidden_size, cfg.intermediate_size
    per_token_layer = 2 * (4 * h * h + _ffn_matrices(cfg) * h * f)  # QKV + output, FFN
    attention_layer = 2 * 2 * length * length * h  # QK^T and PV
    return cfg.num_layers * (length * per_token_layer + attention_layer)


def _ffn_matrices(cfg: BertConfig) -> int:
    """How many H x F matrices a layer's FFN multiplies by: 2, or 3 for a GLU ('modernbert')."""
    return 3 if cfg.is_modern else 2


class Accumulator:
    """Sums metric dicts of numpy scalars; ``reset`` starts a new window."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.sums: dict[str, float] = {}
        self.start = time.perf_counter()
        self.input_wait = 0.0  # seconds the loop waited for host batches in this window
        self.host_seconds = 0.0  # the host pipeline's work on this window's batches
        self.host_rows = 0  # their rows (this process's)
        self.rows = 0  # global rows of the window's applied updates (the loop counts them)
        self.host_timed = True  # False once a batch came without host_seconds

    def add_host_batch(self, host_seconds, host_batch: dict) -> None:
        """Counts one host batch and the pipeline's ``host_seconds`` for it (None: not timed)."""
        self.host_timed = self.host_timed and host_seconds is not None
        if self.host_timed:
            self.host_seconds += float(host_seconds)
            self.host_rows += len(next(iter(host_batch.values())))

    def host_rates(self) -> dict:
        """``host_rate``: rows per second of pipeline work (per busy core); ``host_cores``: that
        work per second of this window, the cores it takes to keep up. Empty when not timed."""
        if not (self.host_timed and self.host_rows):
            return {}
        return {
            "host_rate": ratio(self.host_rows, self.host_seconds),
            "host_cores": self.host_seconds / max(self.elapsed(), 1e-9),
        }

    def add(self, metrics: dict) -> None:
        for k, v in metrics.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def ratio(num: float, den: float) -> float:
    return num / den if den > 0 else float("nan")


def summarize_train(
    sums: dict,
    seconds: float,
    *,
    rows_per_step: int,
    tokens_per_row: int,
    flops_per_row: float,
    num_devices: int,
    peak_flops_per_device: float | None,
) -> dict:
    """Window sums of the train step's metrics (``bertjax.training.step``) -> the mean loss and
    gradient norm per update; instances (``sequences_per_sec``) and real tokens per second and
    per update (from ``instances_sum``/``tokens_sum``; without them, rows and their slots);
    model FLOP/s per device and MFU (from the rows computed, padding and all)."""
    steps = sums["steps"]
    instances = sums.get("instances_sum", steps * rows_per_step)
    tokens = sums.get("tokens_sum", steps * rows_per_step * tokens_per_row)
    out = {
        "loss": ratio(sums["loss_sum"], steps),
        "grad_norm": ratio(sums["grad_norm_sum"], steps),
        "sequences_per_sec": ratio(instances, seconds),
        "tokens_per_sec": ratio(tokens, seconds),
        "instances_per_step": ratio(instances, steps),
        "tokens_per_step": ratio(tokens, steps),
    }
    out["flops_per_device"] = ratio(steps * rows_per_step * flops_per_row, seconds) / num_devices
    if peak_flops_per_device:
        out["mfu"] = out["flops_per_device"] / peak_flops_per_device
    return out


def format_eta(seconds: float) -> str:
    if not np.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


def _compact(value: float) -> str:
    """12345.6 -> '12.3k'; 1234567 -> '1.23M'; 123.4 -> '123'."""
    if not np.isfinite(value):
        return "inf" if value > 0 else "?"
    for size, suffix in ((1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}"


def format_train_line(
    step: int,
    num_steps: int,
    values: dict,
    learning_rate: float,
    eta_seconds: float,
    short_names: tuple[tuple[str, str], ...] = (),
) -> str:
    """``step s/N loss X <the objective's metrics> lr grad_norm seq/s tok/s [inst/step
    tok/step] gflop/s/dev [mfu] [input_wait] [host rows/s/core] eta``; ``short_names`` lists
    the objective's metrics in order with their names here."""
    objective = "".join(f" {short} {values[name]:.4f}" for name, short in short_names)
    per_step = ""
    if "instances_per_step" in values:
        per_step = (
            f"inst/step {values['instances_per_step']:.1f} "
            f"tok/step {values['tokens_per_step']:.0f} "
        )
    mfu = f" mfu {100 * values['mfu']:.1f}%" if "mfu" in values else ""
    if "input_wait" in values:
        mfu += f" input_wait {100 * values['input_wait']:.1f}%"
    if "host_rate" in values:
        mfu += f" host {_compact(values['host_rate'])}/s/core"
    return (
        f"step {step}/{num_steps} loss {values['loss']:.4f}{objective} "
        f"lr {learning_rate:.3g} grad_norm {values['grad_norm']:.3f} "
        f"seq/s {values['sequences_per_sec']:.1f} tok/s {values['tokens_per_sec']:.0f} "
        f"{per_step}"
        f"gflop/s/dev {values['flops_per_device'] / 1e9:.1f}{mfu} eta {format_eta(eta_seconds)}"
    )


def summary_writer(logdir: str):
    """clu's TensorBoard writer (asynchronous; local or ``gs://``) on process 0, a writer that
    drops everything on the others. Scalars are ``write_scalars(step, {name: value})``."""
    import jax  # noqa: PLC0415 - the module itself stays importable without JAX or TensorFlow
    from clu import metric_writers  # noqa: PLC0415 - imports TensorFlow

    if jax.process_index() != 0:
        return metric_writers.MultiWriter([])
    return metric_writers.AsyncWriter(metric_writers.SummaryWriter(logdir))
