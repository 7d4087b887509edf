"""Every workload of one framework timed in one process (bench/accelerator_check.py's children).

A process pays its start-up once (Python, JAX and the device client, the framework's imports),
and JAX's persistent compilation cache (``JAX_COMPILATION_CACHE_DIR``, set by the check) keeps
each compile for the next process and the next run on the same machine.

* :func:`bertjax_row`: the step is lowered for the abstract state (its matmuls' dtypes read from
  the StableHLO), compiled ahead of time, the state materialised, the batch put on the device,
  then ``warmup + measure`` steps, each ending in a host read of the loss (the harness's
  contract, so that both frameworks time the same thing). Kinds (``bench/step_workloads.py``):
  the peers' contract through ``bench/step_bertjax.py``'s model, and a shipped config through
  ``bertjax.pretrain.objective.build_steps``, as ``python -m bertjax.main`` builds it.
* :func:`hf_flax_row`: the harness's own ``step_flax.py`` (``main()`` called once per
  workload), its JSON record read back.

Both rows carry model FLOPs per step from ``bertjax.training.metrics.train_flops_per_sequence``
(rows x the FLOPs of one row: the last layer at [CLS] and the masked positions only, as bertjax
computes it and as a run's log counts it; for a packed row, the row, padding and all, as
``bertjax.pretrain.loop`` counts it), the same figure for both frameworks on a workload, so
their MFU compare as their speeds do; MFU divides by the peak of
``bertjax.training.accelerators.peak_flops_per_device``.
"""

from __future__ import annotations

import gc
import json
import os
import re
import statistics
import sys
import time

import step_workloads  # bench/, beside this file

OUT_OF_MEMORY = re.compile(r"RESOURCE_EXHAUSTED|[Oo]ut of memory|\bOOM\b")
# A dot's result type in StableHLO text: `-> tensor<4x32x96xbf16>`.
_DOT = re.compile(r"stablehlo\.dot_general[^\n]*->\s*tensor<(?:[0-9?]+x)*([a-z]+[0-9]*)>")
# contract impl -> step_bertjax's variant: 'jit' is attention 'auto' as a run has it (the Pallas
# kernel on a GPU or TPU, XLA on CPU).
VARIANT = {"bertjax": "jit", "bertjax-xla": "xlaattention"}


def dot_dtypes(stablehlo: str) -> dict[str, int]:
    """Result element type -> number of ``dot_general`` ops in a lowered module's text."""
    counts: dict[str, int] = {}
    for dtype in _DOT.findall(stablehlo):
        counts[dtype] = counts.get(dtype, 0) + 1
    return counts


def _trainer(name: str, w, impl: str, batch: int, mesh):
    """(trainer, resolved BertConfig, host batch, L, P, the harness's FLOPs or None) of one
    workload at ``batch`` rows, built without the trainer's attention self-check at start-up:
    the check's self_check section compares the kernel at the workloads' settings."""
    if w.kind == "contract":
        import common  # the peers harness
        import step_bertjax  # bench/

        spec = common.load_workload(f"{name}_b{batch}")
        trainer, host_batch = step_bertjax.contract_trainer(spec, VARIANT[impl], mesh, False)
        harness = common.model_flops(spec)["model_flops_per_step"]
        config = trainer.objective.model.config
        return trainer, config, host_batch, spec["seq"], spec["n_masked"], harness
    from bertjax.pretrain import objective

    config = step_workloads.config_for(w, batch)
    config.model.attention_check = False
    steps = objective.build_steps(config, mesh)
    length, predictions = int(config.data.max_seq_length), int(config.data.max_predictions_per_seq)
    host_batch = step_workloads.instance_rows(config, batch)
    return steps.trainer, steps.bert_config, host_batch, length, predictions, None


def _time_bertjax(trainer, host_batch, mesh, warmup: int, measure: int) -> dict:
    """Lower, compile, init, then the steps; seconds of each phase, losses, the step's counts."""
    import jax

    from bertjax.training import sharding as sh

    clock, out = time.perf_counter(), {}
    rng = jax.random.key_data(jax.random.key(1))
    lowered = trainer.train_step.lower(trainer.abstract_state, trainer.train_batch, rng)
    out["dot_dtypes"] = dot_dtypes(lowered.as_text())
    out["lower_s"], clock = time.perf_counter() - clock, time.perf_counter()
    executable = lowered.compile()
    out["compile_s"], clock = time.perf_counter() - clock, time.perf_counter()
    state = trainer.init_state(jax.random.key(0))
    batch = sh.make_global_batch(host_batch, mesh)
    jax.block_until_ready((state, batch))
    out["init_s"] = time.perf_counter() - clock
    times, losses = [], []
    for _ in range(warmup + measure):
        clock = time.perf_counter()
        state, metrics = executable(state, batch, rng)
        losses.append(float(metrics["loss_sum"]))  # the host read that ends the step
        times.append(time.perf_counter() - clock)
    counts = jax.device_get({k: metrics[k] for k in ("instances_sum", "tokens_sum")})
    out.update(steps_s=times[warmup:], loss_first=losses[0], loss_last=losses[-1],
               step_instances=float(counts["instances_sum"]),
               step_tokens=float(counts["tokens_sum"]))  # fmt: skip
    return out


def bertjax_row(name: str, impl: str, w, peak: float | None) -> dict:
    """One bertjax workload at the first batch that fits, timed (module docstring)."""
    import jax

    from bertjax.training import metrics
    from bertjax.training import sharding as sh

    mesh = sh.create_mesh((1, 1, 1), jax.devices()[:1])
    began, tried = time.perf_counter(), []
    for batch in w.batches:
        gc.collect()  # what a batch that ran out of memory left behind
        try:
            built = _trainer(name, w, impl, batch, mesh)
            trainer, config, host_batch, length, predictions, harness = built
            timed = _time_bertjax(trainer, host_batch, mesh, w.warmup_steps, w.measure_steps)
            error = None
        except Exception as e:  # out of memory: the next batch; anything else: the row's error
            error = _error(e)
        tried.append({"batch": batch, "error": error})
        if error == "out of memory":
            continue
        if error:
            return _failed(name, impl, batch, tried, error, began)
        params = {str(leaf.dtype) for leaf in jax.tree.leaves(trainer.abstract_state.params)}
        flops = batch * metrics.train_flops_per_sequence(config, length, predictions)
        row = {"workload": name, "impl": impl, "batch": batch, "tried": tried, "error": None,
               "architecture": config.architecture,
               "dtype": config.dtype, "param_dtypes": sorted(params),
               "attention": config.attention_impl,
               "length": length, "predictions": predictions, "harness_flops_per_step": harness,
               **step_workloads.row_counts(host_batch), **timed}  # fmt: skip
        return _rates(row, flops, peak, began)
    return _failed(name, impl, w.batches[-1], tried, "out of memory at every batch", began)


def hf_flax_row(name: str, w, peak: float | None) -> dict:
    """HF Flax (the harness's step_flax.py, in this process) at the first batch that fits."""
    import common  # the peers harness
    import step_bertjax
    import step_flax

    from bertjax.training import metrics

    began, tried = time.perf_counter(), []
    for batch in w.batches:
        gc.collect()  # what a batch that ran out of memory left behind
        workload = f"{name}_b{batch}"
        results = os.path.join(common.RESULTS_DIR, "steps.jsonl")
        before, error = len(_lines(results)), None
        sys.argv = ["step_flax.py", "--workload", workload]
        try:
            code = step_flax.main()
        except Exception as e:
            code, error = None, _error(e)
        records = _lines(results)[before:]
        record = json.loads(records[-1]) if records else {}
        if code == 0 and "step_s_median" in record:
            tried.append({"batch": batch, "error": None})
            spec = common.load_workload(workload)
            config = step_bertjax.contract_bert_config(spec, VARIANT["bertjax"])
            flops = batch * metrics.train_flops_per_sequence(config, spec["seq"], spec["n_masked"])
            row = {"workload": name, "impl": "hf-flax", "batch": batch, "tried": tried,
                   "error": None, "dtype": spec["dtype"], "param_dtypes": [spec["dtype"]],
                   "attention": "hf", "length": spec["seq"], "predictions": spec["n_masked"],
                   "rows": batch, "instances": batch, "tokens": batch * spec["seq"],
                   "efficiency": 1.0, "compile_s": record["first_step_s"],
                   "steps_s": record["steps_s"], "loss_first": record["loss_first"],
                   "loss_last": record["loss_last"],
                   "harness_flops_per_step": record["model_flops_per_step"]}  # fmt: skip
            return _rates(row, flops, peak, began)
        error = record.get("skipped") or (error if code is None else f"exit {code}")
        tried.append({"batch": batch, "error": error})
        if error != "out of memory":
            return _failed(name, "hf-flax", batch, tried, error, began)
    return _failed(name, "hf-flax", w.batches[-1], tried, "out of memory at every batch", began)


def _rates(row: dict, flops: float, peak: float | None, began: float) -> dict:
    """Adds the step's medians, throughputs, model FLOP/s and MFU, and the row's seconds."""
    median = statistics.median(row["steps_s"])
    achieved = flops / median
    row.update(step_s_median=median, step_s_min=min(row["steps_s"]),
               rows_per_s=row["rows"] / median, instances_per_s=row["instances"] / median,
               tokens_per_s=row["tokens"] / median, model_flops_per_step=flops,
               achieved_flops_per_s=achieved, mfu=achieved / peak if peak else None,
               seconds=time.perf_counter() - began)  # fmt: skip
    print(f"step {row['workload']} {row['impl']} b{row['batch']}: {median:.4f} s, "
          f"{achieved / 1e12:.3g} TFLOP/s, {row['seconds']:.1f} s in all", flush=True)  # fmt: skip
    return row


def _failed(name, impl, batch, tried, error, began) -> dict:
    print(f"step {name} {impl}: {error}", flush=True)
    return {"workload": name, "impl": impl, "batch": batch, "tried": tried, "error": error,
            "seconds": time.perf_counter() - began}  # fmt: skip


def _error(e: Exception) -> str:
    text = f"{type(e).__name__}: {e}"
    if OUT_OF_MEMORY.search(text):
        return "out of memory"
    return text.strip().splitlines()[0][:300]


def _lines(path: str) -> list[str]:
    """The lines of the harness's results file (none yet: [])."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return f.read().splitlines()
