"""Compiles a pretraining config for a TPU slice on any machine with libtpu; says if it fits.

    python -m bertjax.compile --config=configs/large.py --topology=v5litepod-16 [--json] \\
        [--config.model.remat_policy=dots ...]

Builds exactly the train and eval steps ``python -m bertjax.main`` would run for the config and
runs the real TPU compiler on them (``bertjax.pretrain.compile_for_slice``); prints, per chip,
what the compiler says of them (``bertjax.training.compile_report``: memory against the chip's
HBM, FLOPs, HBM bytes, arithmetic intensity, collectives, compile times; the roofline bound is
an estimate, never a measured time).

Exit 0 when both steps fit; 1 with one line saying what is needed against what is there and which
config fields would change that; 1 also for an unknown topology or a config that cannot work.
``--json`` prints one JSON object instead: ``compile_report.JSON_KEYS``, and the rest of the
report (mesh, remat policy, attention implementation, the per-chip split, roofline bound, ...).
"""

from __future__ import annotations

import json

from absl import flags
from ml_collections import config_flags

from bertjax import cli


class DoesNotFit(ValueError):
    """The config needs more HBM per chip than the slice has (the message gives the advice)."""


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


def _define_flags() -> None:
    config_flags.DEFINE_config_file("config", None, "Pretraining config file.", lock_config=True)
    flags.DEFINE_string("topology", None, "TPU slice: v4-32, v5litepod-16, v5p-16, v6e-8, v5e:4x4")
    flags.DEFINE_bool("json", False, "Print one JSON object instead of the table.")
    flags.mark_flags_as_required(["config", "topology"])


def _run(flag_values: flags.FlagValues) -> int:
    import importlib.util  # noqa: PLC0415

    if importlib.util.find_spec("libtpu") is None:
        raise ValueError("the TPU compiler (libtpu) is not installed: pip install 'bertjax[tpu]'")
    from bertjax.pretrain import compile_for_slice  # noqa: PLC0415 - after the flags parse
    from bertjax.training import compile_report  # noqa: PLC0415

    report = compile_for_slice.compile_for(flag_values.config, flag_values.topology)
    if flag_values.json:
        keys = compile_report.JSON_KEYS  # the documented keys always there
        print(json.dumps({**dict.fromkeys(keys), **report}, sort_keys=True), flush=True)
    elif report["fits"]:
        print(compile_report.format_report(report), flush=True)
    if not report["fits"]:
        raise DoesNotFit(advice(flag_values.config, report))
    return 0


def main() -> None:  # also the console script bertjax-compile
    cli.run(_run, _define_flags, prog="compile", tensorflow=False)


if __name__ == "__main__":
    main()
