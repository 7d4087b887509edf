"""The batch-size warm-up: the global batch as a pure function of the step, counted in tokens.

ModernBERT (Warner et al., 2024) starts at 768 sequences and grows its batch to 4,608 over its
first 50B tokens, holding each size for the same number of steps (its
``BatchSizeWarmupScheduler``). ``config.train`` (defaults in ``configs/base.py``):

    batch_warmup_tokens  tokens over which the batch grows (rows x data.max_seq_length: the
                         slots a step computes, which packed rows fill to within a few %);
                         0 = no warm-up, every step takes train.global_batch_size
    batch_warmup_start   the global batch at the first step, in train.global_batch_size's unit
                         (instances when packing: resolved to rows the same way)
    batch_warmup_stages  the sizes the warm-up steps through before the full batch: S evenly
                         spaced sizes from the start up to (not including) the full batch, each
                         rounded to a multiple of the data shards x micro-batches and the process
                         count. Each size is compiled once; ModernBERT's ramp in steps of its
                         micro-batch is S = (4608 - 768) / 96 = 40

**The contract.** Stage ``i`` (0-based, ``i < S``) takes ``sizes[i]`` rows for ``steps_per_stage``
steps, the same for every stage, ``round(batch_warmup_tokens / (L x sum(sizes)))``; every step
after the last stage takes the full batch. Nothing but the step decides the batch, so a resumed
run takes the batch an uninterrupted run takes at that step.

**The data position is counted in units**: ``unit`` rows, the greatest common divisor of all
sizes (the full batch's too). The host pipeline yields batches of one unit and a step of size
``b`` concatenates ``b / unit`` of them, so the rows a run reads are the stream's in order,
whatever the stage, and :meth:`BatchSchedule.units_before` is the unit a resumed run starts at.
With no warm-up a unit is the full batch and one unit is one step, as without this module.

**The learning-rate schedule counts full-batch steps** (:meth:`BatchSchedule.full_batch_steps`:
the tokens seen / (full batch x L)): ``optimizer.warmup_steps``, ``cooldown_steps`` and
``decay_steps`` keep meaning the tokens they meant without a warm-up, as ModernBERT's schedules
count tokens. ``train.num_steps`` still counts updates.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class BatchSchedule:
    full: int  # rows of every step after the warm-up (train.global_batch_size, resolved)
    sizes: tuple[int, ...] = ()  # the warm-up's sizes in rows, increasing, all below ``full``
    steps_per_stage: int = 0
    tokens_per_row: int = 0

    @property
    def unit(self) -> int:
        """Rows per host-pipeline batch (summed over hosts): the gcd of every size."""
        return math.gcd(self.full, *self.sizes)

    @property
    def warmup_steps(self) -> int:
        return len(self.sizes) * self.steps_per_stage

    @property
    def warmup_tokens(self) -> int:
        return self.steps_per_stage * sum(self.sizes) * self.tokens_per_row

    def size(self, step: int) -> int:
        """Global rows of the update that takes the state from ``step`` to ``step + 1``."""
        if step < self.warmup_steps:
            return self.sizes[step // self.steps_per_stage]
        return self.full

    def rows_before(self, step: int) -> int:
        """Global rows that updates 0 .. ``step - 1`` took."""
        done = min(step, self.warmup_steps)
        stages, rest = divmod(done, self.steps_per_stage) if self.sizes else (0, 0)
        rows = self.steps_per_stage * sum(self.sizes[:stages])
        rows += rest * self.sizes[stages] if rest else 0
        return rows + (step - done) * self.full

    def units_before(self, step: int) -> int:
        return self.rows_before(step) // self.unit

    def full_batch_steps(self, step):
        """``rows_before(step) / full`` for a traced or concrete step: piecewise linear, exact at
        integer steps (float32 in a trace)."""
        if not self.sizes:
            return step
        ends = [i * self.steps_per_stage for i in range(len(self.sizes) + 1)]
        xs = np.asarray(ends, np.float32)
        ys = np.asarray([self.rows_before(s) / self.full for s in ends], np.float32)
        step = jnp.asarray(step, jnp.float32)
        # jnp.interp clamps past the last point: then one full-batch step per update.
        inside = jnp.interp(step, xs, ys)
        return jnp.where(step > xs[-1], ys[-1] + (step - xs[-1]), inside)

    def describe(self, num_steps: int) -> str:
        """One line: the warm-up, and what a run of ``num_steps`` updates holds."""
        rows = self.rows_before(num_steps)
        text = (
            f"batch-size warm-up: {', '.join(map(str, self.sizes))} rows, "
            f"{self.steps_per_stage} steps each (steps 0-{self.warmup_steps - 1}, "
            f"{self.warmup_tokens:,} tokens), then {self.full} rows per step"
        )
        return (
            f"{text}; the run's {num_steps:,} updates hold {rows * self.tokens_per_row:,} tokens "
            f"({rows / self.full:,.1f} full-batch steps)"
        )

    def signature(self) -> dict:
        """What names the data stream's batching (``bertjax.pretrain.inputs.data_signature``)."""
        return {"sizes": list(self.sizes), "steps_per_stage": self.steps_per_stage}


def on_mesh(config, mesh, process_count: int) -> BatchSchedule:
    """The schedule of a run of ``config`` on ``mesh`` with ``process_count`` processes."""
    from bertjax.training import sharding  # noqa: PLC0415 - JAX's mesh, only for this

    return from_config(config, sharding.batch_multiple(config, mesh, process_count))


def from_config(config, multiple: int) -> BatchSchedule:
    """The schedule of ``config`` (train.global_batch_size already in rows), its sizes rounded to
    ``multiple`` (data shards x micro-batches, lcm the process count). ValueError naming the
    field when the warm-up cannot work."""
    train = config.train
    full, length = int(train.global_batch_size), int(config.data.max_seq_length)
    tokens = int(float(train.get("batch_warmup_tokens", 0)))
    if tokens < 0:
        raise ValueError(f"config.train.batch_warmup_tokens={tokens}: expected >= 0 (0 = none)")
    if tokens == 0:
        return BatchSchedule(full)
    start, stages = int(train.batch_warmup_start), int(train.batch_warmup_stages)
    if not 0 < start < full:
        raise ValueError(
            f"config.train.batch_warmup_start={start}: expected 1 .. {full - 1}, below "
            f"train.global_batch_size={full} (rows per step)"
        )
    if stages < 1:
        raise ValueError(f"config.train.batch_warmup_stages={stages}: expected >= 1")
    sizes = [start + i * (full - start) / stages for i in range(stages)]
    sizes = [max(multiple, round(s / multiple) * multiple) for s in sizes]
    if len(set(sizes)) < stages or sizes[-1] >= full:
        raise ValueError(
            f"config.train.batch_warmup_stages={stages}: the sizes from batch_warmup_start="
            f"{start} to global_batch_size={full}, in multiples of {multiple} rows (data "
            f"shards x micro-batches, processes), are {sizes}: not {stages} distinct sizes below "
            f"{full}; use fewer stages"
        )
    steps = round(tokens / (length * sum(sizes)))
    if steps < 1:
        raise ValueError(
            f"config.train.batch_warmup_tokens={tokens}: less than one step of each of the "
            f"sizes {sizes} at {length} tokens per row ({length * sum(sizes)} tokens)"
        )
    return BatchSchedule(full, tuple(sizes), steps, length)
