"""The run's fused attention kernel checked on its own devices, at its own shapes, at start-up.

Interpret mode and the compiler are all that checked the Pallas kernels before a run; the
hardware may still differ (an f32 dot on a TPU defaults to bf16 passes; the Mosaic and Triton
lowerings), and a lowering bug may show only at some shapes. So before a loop builds its steps
(``bertjax.pretrain.loop``, ``bertjax.finetune.loop``; feature extraction too), :func:`checked`
compares a resolved fused kernel ('tpu', 'gpu', 'tpu_interpret', 'gpu_interpret') with
``BertConfig.attention_check`` with the XLA path (``bertjax.model.attention.self_check.compare``)
on this process's first device of the mesh: at the run's head size, dtype, attention dropout
rate and causal mask, and at the run's attention shapes (``self_check.Shapes``: its length L,
so the kernel's blocks are the run's; the query count of the gathered last layer; packed rows
when the run packs; a windowed call beside the global one when the model has local layers),
forward and the gradients of q, k and v, dropout on. Building a step
(``sharding.bert_config_for``) checks nothing and allocates nothing.

* It runs once per process for a (kernel, head size, dtype, rate, causal, shapes, device): a
  second builder (the eval step, another fine-tuning run) reuses the outcome.
* Processes agree (one ``process_allgather`` at start-up, never per step): if the kernel fails
  anywhere, every process runs 'xla', so that all compile the same step.
* A pass is one quiet record; a failure prints one line, ``WARNING: attention self-check failed:
  ...``, that names the largest difference, and the step is built with ``attention_impl='xla'``;
  :func:`record_for` gives the outcome that ``bertjax.training.start`` writes into the workdir's
  record (``bertjax_workdir.json``, key ``attention_check``).
* With 'xla', ``attention_check=False``, or a mesh of devices this process cannot run (the TPU
  topology ``python -m bertjax.compile`` lowers for) nothing is checked.

Cost (``self_check``'s docstring has the measurement): on CPU, with the TPU kernel in interpret
mode at D = 64 and L = 128, 2.5 s of CPU time, 4-6 s wall on a loaded 2-core machine; once per
process.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from bertjax.model.attention import self_check
from bertjax.model.config import BertConfig

FUSED_KERNELS = ("tpu", "gpu", "tpu_interpret", "gpu_interpret")
# (kernel, head_dim, dtype, rate, causal, shapes, device id) -> the outcome; once per process.
_outcomes: dict[tuple, self_check.Outcome] = {}
# (head_dim, dtype, rate, causal) -> what the last check at those settings decided, for the record.
_decisions: dict[tuple, dict] = {}


def _settings(bert_config: BertConfig) -> tuple:
    """What the check's input depends on, besides the kernel and the device (the same for a
    config before and after ``attention.resolve``)."""
    return (
        bert_config.head_dim,
        bert_config.dtype,
        float(bert_config.attention_dropout_rate),
        bert_config.attention == "causal",
    )


def _outcome(kernel: str, bert_config: BertConfig, device, shapes) -> self_check.Outcome:
    key = (kernel, *_settings(bert_config), shapes, device.id)
    if key not in _outcomes:
        head_dim, dtype, rate, causal = _settings(bert_config)
        _outcomes[key] = self_check.compare(
            kernel, head_dim=head_dim, dtype=dtype, dropout_rate=rate, causal=causal,
            device=device, shapes=shapes,
        )  # fmt: skip
    return _outcomes[key]


def _failed_processes(passed: bool) -> list[int]:
    """The processes whose check failed (every process calls this at the same point)."""
    if jax.process_count() == 1:
        return [] if passed else [0]
    flags = multihost_utils.process_allgather(np.int32(passed))
    return [i for i, flag in enumerate(np.asarray(flags).reshape(-1)) if not flag]


def checked(bert_config: BertConfig, mesh: Mesh, shapes: self_check.Shapes) -> BertConfig:
    """``bert_config`` (its kernel resolved for ``mesh``: ``sharding.bert_config_for``) as the
    run runs it: unchanged, or with ``attention_impl='xla'`` when its fused kernel fails the check
    at ``shapes``, the run's attention calls (module docstring)."""
    kernel = bert_config.attention_impl
    if kernel not in FUSED_KERNELS or not bert_config.attention_check:
        return bert_config
    local = set(jax.local_devices())
    devices = [d for d in mesh.devices.flat if d in local]
    if not devices:  # an abstract topology (compile), not devices this process runs
        return bert_config
    if bert_config.has_local_layers:  # its local layers' calls are checked beside the global
        shapes = dataclasses.replace(shapes, window=bert_config.local_attention // 2)
    outcome = _outcome(kernel, bert_config, devices[0], shapes)
    failed = _failed_processes(outcome.passed)
    decision = {**outcome.to_dict(), "runs": "xla" if failed else kernel}
    if failed:
        decision["failed_processes"] = failed
    _decisions[_settings(bert_config)] = decision
    if not failed:
        return bert_config
    if jax.process_index() == 0:
        if outcome.passed:
            what = f"the {kernel!r} kernel differs from the XLA path on processes {failed}"
        else:
            owner = f"the {kernel!r} kernel" + ("" if outcome.error else "'s")
            what = f"{owner} {outcome.describe()} on {outcome.device}"
        print(
            f"WARNING: attention self-check failed: {what}; this run uses attention_impl='xla' "
            "(config.model.attention_check=False skips the check)",
            flush=True,
        )
    return bert_config.replace(attention_impl="xla")


def record_for(bert_config: BertConfig) -> dict | None:
    """What the check decided for a run of ``bert_config`` (resolved or not) in this process:
    ``Outcome.to_dict()`` plus ``runs`` (the kernel the step uses); None when nothing was
    checked."""
    return _decisions.get(_settings(bert_config)) if bert_config.attention_check else None
