"""Pretraining's steps compiled for a TPU slice on any machine with libtpu: does a config fit?

``compile_for(config, topology)`` builds exactly the train and eval steps ``python -m
bertjax.main`` would run for the config (``bertjax.pretrain.objective.build_steps``) on a mesh
over the slice's TPU devices, as ``jax.experimental.topologies`` describes them, lowers them
with abstract sharded arguments and runs the real TPU compiler (MaxText's ``train_compile.py``
does the same). Topologies are gcloud accelerator types (``v4-32``, ``v5litepod-16``,
``v5p-16``, ``v6e-8``) or JAX's names (``v5e:4x4``); chips come from
``bertjax.training.accelerators``. The report is ``bertjax.training.compile_report``'s, with the
model's FLOPs per step (``training.metrics``), the real tokens a step holds (:func:`real_tokens`)
and the roofline bound per real token, and, when a step does not fit, ``needed_bytes`` and
``failed_step``.
"""

from __future__ import annotations

import os
import re

from bertjax import startup
from bertjax.pretrain import inputs
from bertjax.pretrain import objective as objective_lib
from bertjax.training import accelerators, metrics
from bertjax.training import compile_report as report_lib
from bertjax.training import sharding as sh

# What libtpu prints when it loads on a machine that is not a TPU VM (it compiles regardless).
_LIBTPU_NOISE = re.compile(
    r"TPU_ACCELERATOR_TYPE|TPU_WORKER_HOSTNAMES|Logging before InitGoogle|"
    r"=== Source Location Trace|libtpu_init_utils\.cc"
)


def data_figures(config) -> dict | None:
    """The train rows' ``instances_per_row`` and ``fill`` that ``config``'s data gives
    (``bertjax.data.pipeline.row_figures``: a packed table is packed to count them), read once
    per compile; None for synthetic data (full rows, one instance each)."""
    if config.train.synthetic_data:
        return None
    startup.import_tensorflow()  # the data is read with it: quietly, before its modules load
    from bertjax.data import pipeline  # noqa: PLC0415

    return pipeline.row_figures(config.data, int(config.seed))


def steps_for_slice(config, topology: str, figures: dict | None = None):
    """-> (slice, steps, train step args, eval step args): ``config``'s steps (``build_steps``)
    on a mesh over ``topology``'s TPU devices, with abstract sharded arguments to lower them; a
    packed config's batch sizes in rows, as ``bertjax.main`` resolves them
    (``bertjax.pretrain.inputs.resolve_packed_batch``, at ``figures``' instances per row when
    given: :func:`data_figures`)."""
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # no metadata server: not on a TPU VM
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compiling only, never running
    from jax.experimental import topologies  # noqa: PLC0415 - after the environment is set

    tpu = accelerators.slice_for(topology)
    devices = startup.filtered_stderr(
        _LIBTPU_NOISE,
        topologies.get_topology_desc,
        topology_name=tpu.topology_name,
        platform="tpu",
        **tpu.topology_options(),
    ).devices
    mesh = sh.create_mesh(config.mesh.shape, devices)
    # A packed config's batch counts instances: the rows main runs (the data is read for them).
    per_row = figures["instances_per_row"] if figures else None
    config = inputs.resolve_packed_batch(config, mesh, tpu.hosts, announce=False, per_row=per_row)
    inputs.check_config(config, objective_lib.bert_config_from(config), mesh, tpu.hosts)
    steps = objective_lib.build_steps(config, mesh)
    return (tpu, steps, *report_lib.abstract_args(steps.trainer, steps.eval_batch))


def real_tokens(config, rows: int, figures: dict | None) -> dict:
    """A step's ``rows`` x ``data.max_seq_length`` slots and the real tokens in them at the
    ``fill`` of :func:`data_figures` (None for synthetic full rows: a fill of 1)."""
    length = int(config.data.max_seq_length)
    fill = figures["fill"] if figures else 1.0
    return {
        "rows_per_step": rows,
        "max_seq_length": length,
        "fill": fill,
        "real_tokens_per_step": rows * length * fill,
    }


def compile_for(config, topology: str) -> dict:
    """Compiles ``config``'s steps for ``topology``; the report (``compile_report.JSON_KEYS``
    and more)."""
    # A packed config's rows per step depend on its data: counted once, before its steps.
    figures = data_figures(config) if config.data.pack_sequences else None
    tpu, steps, train_args, eval_args = steps_for_slice(config, topology, figures)
    abstract, shardings = steps.trainer.abstract_state, steps.trainer.state_shardings
    bert_config = objective_lib.bert_config_from(config)
    hbm = tpu.chip.hbm_bytes
    compiled, train_oom, train_seconds = report_lib.compile_step(
        steps.trainer.train_step, train_args, hbm
    )
    evaluated, eval_oom, eval_seconds = report_lib.compile_step(steps.eval_step, eval_args, hbm)
    length = int(config.data.max_seq_length)
    per_sequence = metrics.train_flops_per_sequence(
        bert_config, length, int(config.data.max_predictions_per_seq)
    )
    per_chip, batch = report_lib.per_chip_bytes, train_args[1]
    report = {
        "topology": tpu.name, "jax_topology": tpu.topology_name, "chip": tpu.chip.name,
        "chips": tpu.chips, "hosts": tpu.hosts, "mesh": dict(steps.trainer.mesh.shape),
        "hbm_bytes_per_chip": hbm, "fits": train_oom is None and eval_oom is None,
        "model_flops_per_step": per_sequence * int(batch["input_ids"].shape[0]),  # rows
        "compile_seconds": {"train": round(train_seconds, 1), "eval": round(eval_seconds, 1)},
        "params_bytes": per_chip(abstract.params, shardings.params),
        "optimizer_state_bytes": per_chip(abstract.opt_state, shardings.opt_state),
        "batch_bytes": per_chip(batch, report_lib.shardings_of(batch)),
        "scan_layers": bert_config.scan_layers,
        "remat_policy": bert_config.remat_policy,
        "attention_impl": steps.bert_config.attention_impl,
        "dtype": bert_config.dtype,
    }  # fmt: skip
    if compiled is None:
        return {**report, "needed_bytes": train_oom, "failed_step": "train"}
    micro_batches = int(config.train.grad_accum_steps)
    report.update(report_lib.compiled_figures(compiled, tpu.chip, micro_batches))
    if figures is None:  # an unpacked config's fill: its data read only for a step that fits
        figures = data_figures(config)
    report.update(real_tokens(config, int(batch["input_ids"].shape[0]), figures))
    report["bound_seconds_per_real_token"] = (
        report["roofline_seconds"] / report["real_tokens_per_step"]
    )
    if eval_oom is not None:
        report.update(needed_bytes=eval_oom, failed_step="eval")
    return report
