"""Host-side metrics: accumulating the step's sums, FLOPs/MFU, console lines, TensorBoard.

The train and eval steps return *sums* and *counts* (``bertjax.losses``); this module adds them up
over ``log_every`` steps and divides once on the host, so an average is exact regardless of how
many masked positions each batch had. MLM accuracy is MLPerf's: correct masked predictions /
weighted masked positions.

MFU = model FLOPs per second (``train_flops_per_sequence``: the matmuls the model computes,
bidirectional attention counted in full) / the devices' peak (``peak_flops_per_device``):
``config.train.peak_flops``, else the dense peak of a known TPU/GPU, else (CPU, unknown devices)
the fp32 matmul ceiling measured at start-up, so on CPU the figure reads "MFU vs the measured
matmul ceiling".
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bertjax import cpu_gemm
from bertjax.model import BertConfig

# Dense peak FLOP/s of one device (bf16 on accelerators), by a substring of ``device_kind``.
PEAK_FLOPS = {
    "TPU v6": 918e12,
    "TPU v5p": 459e12,
    "TPU v5": 197e12,  # v5e / v5 lite
    "TPU v4": 275e12,
    "TPU v3": 123e12,
    "TPU v2": 45e12,
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
}


def measure_matmul_flops(
    size: int | None = None,
    min_seconds: float = 0.3,
    clock: Callable[[], float] = time.perf_counter,
    matmul: str = "xla",
) -> float:
    """The measured fp32 matmul ceiling of one local device, FLOP/s (about 0.5 s).

    ``matmul`` is the engine the model uses (``BertConfig.matmul``): 'blas' times the MKL kernel
    of cpu_gemm.py (one device), 'xla' XLA's own dot.

    Every local device multiplies a <float32>[size, size] matrix by itself at once, so devices
    that share a host's cores (XLA's fake CPU devices) share its ceiling instead of each
    claiming all of it. ``size`` defaults to 2048 on one device (1024 under-reads wide-vector
    CPUs: 238 against ~430-450 GFLOP/s at 2048 and on BERT-base's FFN GEMM on an AMD EPYC Zen 5,
    docs/benchmarks.md), shrunk for several devices so one call is the same total work (8
    devices: 1024 each). After a compile-and-warm-up call, the fastest of at least 3 calls
    lasting ``min_seconds`` in all counts: noise from other processes only slows a call.
    """
    # The blas kernel only runs on a single-device process (cpu_gemm.resolve).
    devices = jax.local_devices()[:1] if matmul == "blas" else jax.local_devices()
    if size is None:
        size = max(128, int(round(2048 / len(devices) ** (1 / 3) / 128)) * 128)
    sharding = NamedSharding(Mesh(np.array(devices), ("devices",)), PartitionSpec("devices"))
    matrices = jax.device_put(np.ones((len(devices), size, size), np.float32), sharding)
    if matmul == "blas":
        product = jax.jit(lambda x: cpu_gemm.dot(x, x))
    else:
        product = jax.jit(lambda x: jnp.einsum("dij,djk->dik", x, x), out_shardings=sharding)
    product(matrices).block_until_ready()
    best, total, calls = float("inf"), 0.0, 0
    while total < min_seconds or calls < 3:
        start = clock()
        product(matrices).block_until_ready()
        seconds = clock() - start
        best, total, calls = min(best, seconds), total + seconds, calls + 1
    return 2.0 * size**3 / best


def peak_flops_per_device(
    configured: float, device_kind: str | None = None, matmul: str = "xla"
) -> tuple[float, str]:
    """(peak FLOP/s of one device, where it comes from), the denominator of MFU.

    ``configured`` (``config.train.peak_flops``) if > 0; else the table's dense peak for
    ``device_kind`` (default: this process's devices); else (CPU, unknown accelerators) the
    fp32 matmul ceiling measured now, so MFU reads "vs the measured matmul ceiling".
    """
    if configured > 0:
        return float(configured), "config.train.peak_flops"
    kind = device_kind or jax.devices()[0].device_kind
    for key, value in PEAK_FLOPS.items():
        if key.lower() in kind.lower():
            return value, f"dense peak of {key} from bertjax.metrics.PEAK_FLOPS ({kind})"
    engine = "MKL sgemm" if matmul == "blas" else "XLA dot"
    return measure_matmul_flops(matmul=matmul), (
        f"measured fp32 {engine} ceiling of this {kind} device (set config.train.peak_flops "
        "to use another peak)"
    )


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
    peak_flops_total: float,
) -> dict:
    """Window sums -> the scalars a user sees (means, rates, MFU)."""
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
    if peak_flops_total:
        out["mfu"] = out["sequences_per_sec"] * flops_per_sequence / peak_flops_total
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
    mfu = f"{100 * values['mfu']:.1f}%" if "mfu" in values else "n/a"
    return (
        f"step {step}/{num_steps} loss {values['loss']:.4f} "
        f"mlm_loss {values['mlm_loss']:.4f} mlm_acc {values['mlm_accuracy']:.4f} "
        f"nsp_loss {values['nsp_loss']:.4f} nsp_acc {values['nsp_accuracy']:.4f} "
        f"lr {learning_rate:.3g} grad_norm {values['grad_norm']:.3f} "
        f"seq/s {values['sequences_per_sec']:.1f} tok/s {values['tokens_per_sec']:.0f} "
        f"mfu {mfu} eta {format_eta(eta_seconds)}"
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
