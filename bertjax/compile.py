"""Compiles a pretraining config for a TPU slice on any machine with libtpu; says if it fits.

    python -m bertjax.compile --config=configs/large.py --topology=v5litepod-16 [--json] \\
        [--config.model.remat_policy=dots ...]

Builds exactly the train and eval steps ``python -m bertjax.main`` would run for the config
(``bertjax.pretrain.objective.build_steps``) on a mesh over the slice's TPU devices, as
``jax.experimental.topologies`` describes them, lowers them with abstract sharded arguments and
runs the real TPU compiler (MaxText's ``train_compile.py`` does the same). Topologies are gcloud
accelerator types (``v4-32``, ``v5litepod-16``, ``v5p-16``, ``v6e-8``) or JAX's names
(``v5e:4x4``); chips come from ``bertjax.training.accelerators``.

It prints, per chip: params, optimizer state, batch, temporaries and code against the chip's
HBM (``memory_analysis``: argument + output - aliased + temporaries + code, the compiler's own
sum), the model's FLOPs per step (``training.metrics``), the compiler's FLOPs and HBM bytes
(``cost_analysis``), the arithmetic intensity against the chip's ridge point, the collectives in
the HLO by kind (each channel once; a collective in a loop body counts once), and the compile
times. The roofline bound ``max(FLOPs / peak, bytes / bandwidth)`` is an estimate, never a
measured time; with ``scan_layers`` the compiler's counts cover one loop body (one layer).

Exit 0 when both steps fit; 1 with one line saying what is needed against what is there and which
config fields would change that; 1 also for an unknown topology or a config that cannot work.
``--json`` prints one JSON object instead: ``JSON_KEYS``, and the rest of the report (mesh,
remat policy, attention implementation, the per-chip split, roofline bound, ...).
"""

from __future__ import annotations

import json
import math
import os
import re
import time

from absl import flags
from ml_collections import config_flags

from bertjax import cli, startup

JSON_KEYS = (
    "topology", "chips", "fits", "hbm_bytes_per_chip", "argument_bytes", "temp_bytes",
    "output_bytes", "model_flops_per_step", "compiler_flops_per_chip",
    "compiler_hbm_bytes_per_chip", "collectives", "compile_seconds",
)  # fmt: skip
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_SIZE = r"([\d.]+[KMGT]?)"
_OOM = (  # the TPU compiler's two forms; needed bytes = group 1 (+ group 2 when exceeded by)
    re.compile(rf"total memory required for HLO temporaries \({_SIZE}\)"),
    re.compile(rf"Used {_SIZE} of [\d.]+[KMGT]? hbm\. Exceeded hbm capacity by {_SIZE}"),
)
# What libtpu prints when it loads on a machine that is not a TPU VM (it compiles regardless).
_LIBTPU_NOISE = re.compile(
    r"TPU_ACCELERATOR_TYPE|TPU_WORKER_HOSTNAMES|Logging before InitGoogle|"
    r"=== Source Location Trace|libtpu_init_utils\.cc"
)


class DoesNotFit(ValueError):
    """The config needs more HBM per chip than the slice has (the message gives the advice)."""


def _define_flags() -> None:
    config_flags.DEFINE_config_file("config", None, "Pretraining config file.", lock_config=True)
    flags.DEFINE_string("topology", None, "TPU slice: v4-32, v5litepod-16, v5p-16, v6e-8, v5e:4x4")
    flags.DEFINE_bool("json", False, "Print one JSON object instead of the table.")
    flags.mark_flags_as_required(["config", "topology"])


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


def _per_chip_bytes(abstract_tree, sharding_tree) -> int:
    import jax  # noqa: PLC0415

    leaves = zip(jax.tree.leaves(abstract_tree), jax.tree.leaves(sharding_tree), strict=True)
    return sum(
        math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize for a, s in leaves
    )  # fmt: skip


def _abstract_args(steps):
    """(state, batch, rng) and (params, eval batch) as ShapeDtypeStructs with shardings."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    from jax.sharding import NamedSharding, PartitionSpec  # noqa: PLC0415

    from bertjax.training import sharding as sh  # noqa: PLC0415

    trainer = steps.trainer
    with_sharding = lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
    state = jax.tree.map(with_sharding, trainer.abstract_state, trainer.state_shardings)
    batch_of = lambda spec: {
        k: with_sharding(v, sh.batch_sharding(trainer.mesh, len(v.shape))) for k, v in spec.items()
    }
    replicated = NamedSharding(trainer.mesh, PartitionSpec())
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated)
    return (state, batch_of(trainer.train_batch), rng), (state.params, batch_of(steps.eval_batch))


def _compile(jitted, args, hbm_bytes: int):
    """-> (compiled or None, needed bytes per chip if it does not fit, seconds)."""
    import jax  # noqa: PLC0415

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


def steps_for_slice(config, topology: str):
    """-> (slice, steps, train step args, eval step args): ``config``'s steps (``build_steps``)
    on a mesh over ``topology``'s TPU devices, with abstract sharded arguments to lower them."""
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # no metadata server: not on a TPU VM
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compiling only, never running
    from jax.experimental import topologies  # noqa: PLC0415

    from bertjax.pretrain import inputs  # noqa: PLC0415
    from bertjax.pretrain import objective as objective_lib  # noqa: PLC0415
    from bertjax.training import accelerators  # noqa: PLC0415
    from bertjax.training import sharding as sh  # noqa: PLC0415

    tpu = accelerators.slice_for(topology)
    devices = startup.filtered_stderr(
        _LIBTPU_NOISE,
        topologies.get_topology_desc,
        topology_name=tpu.topology_name,
        platform="tpu",
        **tpu.topology_options(),
    ).devices
    mesh = sh.create_mesh(config.mesh.shape, devices)
    inputs.check_config(config, objective_lib.bert_config_from(config), mesh, tpu.hosts)
    steps = objective_lib.build_steps(config, mesh)
    return (tpu, steps, *_abstract_args(steps))


def compile_for(config, topology: str) -> dict:
    """Compiles ``config``'s steps for ``topology``; the report (``JSON_KEYS`` and more)."""
    from bertjax.pretrain import objective as objective_lib  # noqa: PLC0415
    from bertjax.training import metrics  # noqa: PLC0415

    tpu, steps, train_args, eval_args = steps_for_slice(config, topology)
    abstract, shardings = steps.trainer.abstract_state, steps.trainer.state_shardings
    bert_config = objective_lib.bert_config_from(config)
    hbm = tpu.chip.hbm_bytes
    compiled, train_oom, train_seconds = _compile(steps.trainer.train_step, train_args, hbm)
    evaluated, eval_oom, eval_seconds = _compile(steps.eval_step, eval_args, hbm)
    length = int(config.data.max_seq_length)
    per_sequence = metrics.train_flops_per_sequence(
        bert_config, length, int(config.data.max_predictions_per_seq)
    )
    report = {
        "topology": tpu.name, "jax_topology": tpu.topology_name, "chip": tpu.chip.name,
        "chips": tpu.chips, "hosts": tpu.hosts, "mesh": dict(steps.trainer.mesh.shape),
        "hbm_bytes_per_chip": hbm, "fits": train_oom is None and eval_oom is None,
        "model_flops_per_step": per_sequence * int(config.train.global_batch_size),
        "compile_seconds": {"train": round(train_seconds, 1), "eval": round(eval_seconds, 1)},
        "params_bytes": _per_chip_bytes(abstract.params, shardings.params),
        "optimizer_state_bytes": _per_chip_bytes(abstract.opt_state, shardings.opt_state),
        "batch_bytes": _per_chip_bytes(train_args[1], jax_shardings(train_args[1])),
        "scan_layers": bert_config.scan_layers,
        "remat_policy": bert_config.remat_policy,
        "attention_impl": steps.bert_config.attention_impl,
        "dtype": bert_config.dtype,
    }  # fmt: skip
    if compiled is None:
        return {**report, "needed_bytes": train_oom, "failed_step": "train"}
    report.update(_compiled_figures(compiled, tpu.chip))
    if eval_oom is not None:
        report.update(needed_bytes=eval_oom, failed_step="eval")
    return report


def jax_shardings(tree):
    import jax  # noqa: PLC0415

    return jax.tree.map(lambda a: a.sharding, tree)


def _compiled_figures(compiled, chip) -> dict:
    memory, cost = compiled.memory_analysis(), compiled.cost_analysis()
    flops, hbm_traffic = float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))
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
        "compiler_flops_per_chip": flops,
        "compiler_hbm_bytes_per_chip": hbm_traffic,
        "arithmetic_intensity": flops / hbm_traffic if hbm_traffic else float("nan"),
        "ridge_point": chip.ridge_flops_per_byte,
        "roofline_seconds": max(flops / chip.peak_bf16_flops, hbm_traffic / chip.hbm_bytes_per_sec),
        "collectives": count_collectives(compiled.as_text()),
    }


def advice(config, report: dict) -> str:
    """The one-line error of a config that does not fit: needed vs there, and what to change."""
    gib = lambda n: f"{n / (1 << 30):.2f} GiB"
    mesh, chips = report["mesh"], report["chips"]
    batch, accum = int(config.train.global_batch_size), int(config.train.grad_accum_steps)
    per_chip = batch // accum // max(1, mesh["data"] * mesh["fsdp"])
    fixes = []
    state = report["params_bytes"] + report["optimizer_state_bytes"]
    fsdp = f"--config.mesh.shape=1,{chips},1 (FSDP: params and Adam state split over the chips)"
    if mesh["fsdp"] < chips and state > report["hbm_bytes_per_chip"] / 2:
        fixes.append(f"{fsdp}: they alone take {gib(state)} per chip now")
    if config.model.remat_policy != "full":
        better = "dots" if config.model.remat_policy == "none" else "full"
        fixes.append(f"--config.model.remat_policy={better} (now {config.model.remat_policy})")
    if mesh["fsdp"] < chips and state <= report["hbm_bytes_per_chip"] / 2:
        fixes.append(fsdp)
    if (batch // accum) % 2 == 0:
        fixes.append(
            f"--config.train.grad_accum_steps={2 * accum} (micro-batches of {batch // accum // 2})"
        )
    fixes.append(f"a smaller per-chip batch (now {per_chip}: global_batch_size, or more chips)")
    return (
        f"the {report['failed_step']} step does not fit {report['topology']}: it needs "
        f"{gib(report['needed_bytes'])} per chip, a {report['chip']} chip has "
        f"{gib(report['hbm_bytes_per_chip'])}; try " + "; or ".join(fixes)
    )


def format_report(report: dict) -> str:
    """The human-readable breakdown printed when the config fits."""
    gib = lambda n: f"{n / (1 << 30):8.2f} GiB"
    hbm, needed = report["hbm_bytes_per_chip"], report["needed_bytes"]
    mesh = " ".join(f"{k}={v}" for k, v in report["mesh"].items())
    flops, traffic = report["compiler_flops_per_chip"], report["compiler_hbm_bytes_per_chip"]
    model = report["model_flops_per_step"]
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
        f"model FLOPs per step {model:.3e} ({model / report['chips']:.3e} per chip); compiler "
        f"per chip: {flops:.3e} FLOPs, {traffic:.3e} HBM bytes",
        f"arithmetic intensity {report['arithmetic_intensity']:.0f} FLOP/byte (the "
        f"{report['chip']} ridge point: {report['ridge_point']:.0f}); roofline bound "
        f"{1e3 * report['roofline_seconds']:.1f} ms per step (an estimate, not a measurement)",
        "collectives: " + ", ".join(f"{k} {v}" for k, v in report["collectives"].items()),
    ]
    if report["scan_layers"]:
        lines.append("scan_layers: the compiler's FLOPs and bytes cover one loop body (one layer)")
    return "\n".join(lines)


def _run(flag_values: flags.FlagValues) -> int:
    import importlib.util  # noqa: PLC0415

    if importlib.util.find_spec("libtpu") is None:
        raise ValueError("the TPU compiler (libtpu) is not installed: pip install 'bertjax[tpu]'")
    report = compile_for(flag_values.config, flag_values.topology)
    if flag_values.json:
        report = {**dict.fromkeys(JSON_KEYS), **report}  # the documented keys always there
        print(json.dumps(report, sort_keys=True), flush=True)
    elif report["fits"]:
        print(format_report(report), flush=True)
    if not report["fits"]:
        raise DoesNotFit(advice(flag_values.config, report))
    return 0


def main() -> None:  # also the console script bertjax-compile
    cli.run(_run, _define_flags, prog="compile", tensorflow=False)


if __name__ == "__main__":
    main()
