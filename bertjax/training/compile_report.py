"""What the compiler says of a compiled step: the report ``python -m bertjax.compile`` prints.

Per chip: params, optimizer state, batch, temporaries and code against the chip's HBM
(``memory_analysis``: argument + output - aliased + temporaries + code, the compiler's own sum),
the compiler's FLOPs and HBM bytes (``cost_analysis``; it counts a loop's body once, so with
``train.grad_accum_steps`` = k a step's are k times the micro-batch's: :func:`compiled_figures`),
the arithmetic intensity against the chip's ridge point, the collectives in the HLO by kind
(each channel once; a collective in a loop body counts once), and the compile times. The
roofline bound ``max(FLOPs / peak, bytes / bandwidth)`` per step, and per real token (the
step's rows x length slots at the fill the config's data gives), is an estimate, never a
measured time; with ``scan_layers`` the compiler's counts cover one loop body (one layer). What
is compiled, and for which slice, is the caller's (``bertjax.pretrain.compile_for_slice``);
``bench/`` uses these functions for its peers too.

``JSON_KEYS`` are the keys ``--json`` always prints.
"""

from __future__ import annotations

import math
import re
import time

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from bertjax.training import sharding as sh

JSON_KEYS = (
    "topology", "chips", "fits", "hbm_bytes_per_chip", "argument_bytes", "temp_bytes",
    "output_bytes", "model_flops_per_step", "compiler_flops_per_chip",
    "compiler_hbm_bytes_per_chip", "micro_batches", "step_flops_per_chip",
    "step_hbm_bytes_per_chip", "roofline_seconds", "rows_per_step", "max_seq_length", "fill",
    "real_tokens_per_step", "bound_seconds_per_real_token", "collectives", "compile_seconds",
)  # fmt: skip
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_SIZE = r"([\d.]+[KMGT]?)"
_OOM = (  # the TPU compiler's two forms; needed bytes = group 1 (+ group 2 when exceeded by)
    re.compile(rf"total memory required for HLO temporaries \({_SIZE}\)"),
    re.compile(rf"Used {_SIZE} of [\d.]+[KMGT]? hbm\. Exceeded hbm capacity by {_SIZE}"),
)


def _bytes(text: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    return int(float(text.rstrip("KMGT")) * units[text[-1] if text[-1] in units else ""])


def oom_needed_bytes(message: str) -> int | None:
    """Bytes per chip a RESOURCE_EXHAUSTED compile error says the program needs, or None."""
    if match := _OOM[0].search(message):
        return _bytes(match.group(1))
    if match := _OOM[1].search(message):
        return _bytes(match.group(1)) + _bytes(match.group(2))
    return None


def count_collectives(hlo_text: str) -> dict[str, int]:
    """Collectives in compiled HLO by kind, each (kind, channel) once; async pairs once (the
    ``-start``); an all-reduce fused into an ``all-reduce-scatter`` computation is a
    reduce-scatter."""
    seen: set = set()
    computation = ""
    op = re.compile(r"\s(" + "|".join(COLLECTIVES) + r")(-start)?\(")
    for number, line in enumerate(hlo_text.splitlines()):
        if line.rstrip().endswith("{") and " = " not in line:
            computation = line.split()[1 if line.startswith("ENTRY") else 0].lstrip("%")
        match = op.search(line)
        if not match:
            continue
        kind = match.group(1)
        if kind == "all-reduce" and computation.startswith("all-reduce-scatter"):
            kind = "reduce-scatter"
        channel = re.search(r"channel_id=(\d+)", line)
        seen.add((kind, channel.group(1) if channel else f"line{number}"))
    return {kind: sum(1 for k, _ in seen if k == kind) for kind in COLLECTIVES}


def per_chip_bytes(abstract_tree, sharding_tree) -> int:
    """Bytes one chip holds of a sharded tree (each leaf's shard shape)."""
    leaves = zip(jax.tree.leaves(abstract_tree), jax.tree.leaves(sharding_tree), strict=True)
    return sum(
        math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize for a, s in leaves
    )  # fmt: skip


def abstract_args(trainer, eval_batch: dict):
    """(state, batch, rng) for ``trainer.train_step`` and (params, eval batch) for an eval step,
    as ShapeDtypeStructs with the shardings the run gives them."""
    with_sharding = lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
    state = jax.tree.map(with_sharding, trainer.abstract_state, trainer.state_shardings)
    batch_of = lambda spec: {
        k: with_sharding(v, sh.batch_sharding(trainer.mesh, len(v.shape))) for k, v in spec.items()
    }
    replicated = NamedSharding(trainer.mesh, PartitionSpec())
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated)
    return (state, batch_of(trainer.train_batch), rng), (state.params, batch_of(eval_batch))


def compile_step(jitted, args, hbm_bytes: int):
    """Lowers and compiles ``jitted`` for ``args`` -> (compiled or None, needed bytes per chip
    if it does not fit ``hbm_bytes``, seconds)."""
    started = time.perf_counter()
    try:
        compiled = jitted.lower(*args).compile()
    except jax.errors.JaxRuntimeError as e:
        needed = oom_needed_bytes(str(e))
        if "RESOURCE_EXHAUSTED" not in str(e) or needed is None:
            raise
        return None, needed, time.perf_counter() - started
    memory = compiled.memory_analysis()
    needed = (
        memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
        + memory.temp_size_in_bytes + memory.generated_code_size_in_bytes
    )  # fmt: skip
    return compiled, (needed if needed > hbm_bytes else None), time.perf_counter() - started


def shardings_of(tree):
    """The sharding of every leaf of a tree of ShapeDtypeStructs."""
    return jax.tree.map(lambda a: a.sharding, tree)


def compiled_figures(compiled, chip, micro_batches: int = 1) -> dict:
    """Memory, cost and collectives of a compiled step on ``chip``
    (``bertjax.training.accelerators``). XLA's cost analysis counts a loop's body once, so with
    ``micro_batches`` > 1 (``train.grad_accum_steps``: a ``lax.scan`` over them) the compiler's
    figures (``compiler_*``) cover one micro-batch plus the update; the step's (``step_*``,
    and the roofline bound from them) are ``micro_batches`` times that, which counts the update
    ``micro_batches`` times: an upper estimate, by the update's share."""
    memory, cost = compiled.memory_analysis(), compiled.cost_analysis()
    counted = float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))
    flops, hbm_traffic = (micro_batches * c for c in counted)
    needed = (
        memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
        + memory.temp_size_in_bytes + memory.generated_code_size_in_bytes
    )  # fmt: skip
    return {
        "argument_bytes": memory.argument_size_in_bytes,
        "output_bytes": memory.output_size_in_bytes,
        "alias_bytes": memory.alias_size_in_bytes,
        "temp_bytes": memory.temp_size_in_bytes,
        "code_bytes": memory.generated_code_size_in_bytes,
        "needed_bytes": needed,
        "compiler_flops_per_chip": counted[0],
        "compiler_hbm_bytes_per_chip": counted[1],
        "micro_batches": micro_batches,
        "step_flops_per_chip": flops,
        "step_hbm_bytes_per_chip": hbm_traffic,
        "arithmetic_intensity": flops / hbm_traffic if hbm_traffic else float("nan"),
        "ridge_point": chip.ridge_flops_per_byte,
        "roofline_seconds": max(flops / chip.peak_bf16_flops, hbm_traffic / chip.hbm_bytes_per_sec),
        "collectives": count_collectives(compiled.as_text()),
    }


def format_report(report: dict) -> str:
    """The human-readable breakdown printed when the config fits."""
    gib = lambda n: f"{n / (1 << 30):8.2f} GiB"
    hbm, needed = report["hbm_bytes_per_chip"], report["needed_bytes"]
    mesh = " ".join(f"{k}={v}" for k, v in report["mesh"].items())
    flops, traffic = report["step_flops_per_chip"], report["step_hbm_bytes_per_chip"]
    model = report["model_flops_per_step"]
    micro = report["micro_batches"]
    counted = (
        f"compiler per chip: {flops:.3e} FLOPs, {traffic:.3e} HBM bytes"
        if micro == 1
        else f"per chip and step: {flops:.3e} FLOPs, {traffic:.3e} HBM bytes ({micro} x the "
        f"compiler's {report['compiler_flops_per_chip']:.3e} and "
        f"{report['compiler_hbm_bytes_per_chip']:.3e}: it counts the micro-batch loop's body once)"
    )
    real = report.get("real_tokens_per_step")
    per_token = (
        f"; {1e9 * report['roofline_seconds'] / real:.1f} ns per real token ({real:,.0f} a step: "
        f"{report['rows_per_step']:,} rows x {report['max_seq_length']:,} slots at the data's "
        f"{100 * report['fill']:.1f}% fill)"
        if real
        else ""
    )
    lines = [
        f"{report['topology']}: {report['chips']} x {report['chip']} on {report['hosts']} "
        f"host(s) (JAX topology {report['jax_topology']}), mesh {mesh}",
        f"compiled the train step in {report['compile_seconds']['train']} s, the eval step in "
        f"{report['compile_seconds']['eval']} s",
        "per chip:",
        f"  params            {gib(report['params_bytes'])}",
        f"  optimizer state   {gib(report['optimizer_state_bytes'])}",
        f"  batch             {gib(report['batch_bytes'])}",
        f"  temporaries       {gib(report['temp_bytes'])}",
        f"  generated code    {gib(report['code_bytes'])}",
        f"  needed            {gib(needed)} of {gib(hbm).strip()} HBM: fits, "
        f"{(hbm - needed) / (1 << 30):.2f} GiB ({100 * (hbm - needed) / hbm:.1f}%) headroom",
        f"model FLOPs per step {model:.3e} ({model / report['chips']:.3e} per chip); {counted}",
        f"arithmetic intensity {report['arithmetic_intensity']:.0f} FLOP/byte (the "
        f"{report['chip']} ridge point: {report['ridge_point']:.0f}); roofline bound "
        f"{1e3 * report['roofline_seconds']:.1f} ms per step{per_token} (an estimate, not a "
        "measurement)",
        "collectives: " + ", ".join(f"{k} {v}" for k, v in report["collectives"].items()),
    ]
    if report["scan_layers"]:
        lines.append("scan_layers: the compiler's FLOPs and bytes cover one loop body (one layer)")
    return "\n".join(lines)
