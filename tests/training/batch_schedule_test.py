"""``bertjax.training.batch_schedule``: the batch-size warm-up as a pure function of the step.

ModernBERT's ramp (768 -> 4,608 sequences in steps of its 96-sequence micro-batch over 50B
tokens) against a transcription of the rule its ``BatchSizeWarmupScheduler`` publishes (each size
holds for tokens in proportion to itself, so for the same number of steps); the data position
in units; the full-batch steps the learning-rate schedule counts; one-line errors naming the
field. The run itself (a resume across a change of size reads the stream in order and ends
bit-exact) is tests/pretrain/modern_recipe_test.py's.
"""

import math

import jax
import ml_collections
import numpy as np
import pytest

from bertjax.training import batch_schedule, optimizer


def _config(full, *, tokens=0, start=0, stages=4, length=1024):
    return ml_collections.ConfigDict(
        {
            "train": {
                "global_batch_size": full,
                "batch_warmup_tokens": tokens,
                "batch_warmup_start": start,
                "batch_warmup_stages": stages,
            },
            "data": {"max_seq_length": length},
        }
    )


_SMALL = _config(64, tokens=4000, start=16, stages=3, length=25)


def _modernbert_sizes(min_units, max_units, micro, length, warmup_tokens, steps):
    """The batch (rows) of each step by ModernBERT's published rule: sizes ``min .. max - 1``
    units of ``micro`` rows, size ``b`` in use until the tokens seen reach
    ``warmup_tokens * cumsum(b) / sum(all b)``, then ``max``; full rows of ``length`` tokens."""
    sizes = list(range(min_units, max_units))
    thresholds = [math.ceil(warmup_tokens * c / sum(sizes)) for c in np.cumsum(sizes)]
    seen, out = 0, []
    for _ in range(steps):
        units = next((b for b, t in zip(sizes, thresholds, strict=True) if seen < t), max_units)
        out.append(units * micro)
        seen += units * micro * length
    return out


def test_modernberts_ramp_holds_each_size_as_its_scheduler_does():
    config = _config(4608, tokens=50_000_000_000, start=768, stages=40)
    schedule = batch_schedule.from_config(config, multiple=96)
    assert schedule.sizes == tuple(range(768, 4608, 96)) and schedule.unit == 96
    steps = schedule.warmup_steps + 100
    ours = [schedule.size(s) for s in range(steps)]
    theirs = _modernbert_sizes(8, 48, 96, 1024, 50_000_000_000, steps)
    # Its thresholds are tokens, so each size holds for 462 or 463 steps there (462.4 on
    # average), 462 here. At every step the two agree to within one micro-batch, and the full
    # batch starts within one step per size of its start there, 0.1% of the tokens apart.
    assert max(abs(a - b) for a, b in zip(ours, theirs, strict=True)) == 96
    assert {ours.count(size) for size in schedule.sizes} == {462}
    assert {theirs.count(size) for size in schedule.sizes} == {462, 463}
    assert 0 < theirs.index(4608) - ours.index(4608) <= 40
    assert abs(schedule.warmup_tokens - 50e9) / 50e9 < 1e-3


def test_the_data_position_counts_the_rows_every_step_took():
    schedule = batch_schedule.from_config(_SMALL, 8)
    assert schedule.sizes == (16, 32, 48) and schedule.unit == 16
    assert schedule.steps_per_stage == round(4000 / (25 * 96)) == 2
    taken = 0
    for step in range(12):
        assert schedule.rows_before(step) == taken
        assert schedule.units_before(step) * schedule.unit == taken
        taken += schedule.size(step)
    assert [schedule.size(s) for s in range(8)] == [16, 16, 32, 32, 48, 48, 64, 64]


def test_no_warm_up_is_one_unit_a_step():
    schedule = batch_schedule.from_config(_config(256), 8)
    assert (schedule.unit, schedule.sizes, schedule.size(0)) == (256, (), 256)
    assert [schedule.units_before(s) for s in range(4)] == [0, 1, 2, 3]
    assert schedule.full_batch_steps(7) == 7


def test_the_learning_rate_counts_full_batch_steps():
    schedule = batch_schedule.from_config(_SMALL, 8)
    traced = jax.jit(schedule.full_batch_steps)
    for step in range(12):
        want = schedule.rows_before(step) / 64
        assert float(traced(step)) == pytest.approx(want, abs=1e-6)
    opt = ml_collections.ConfigDict({"schedule": "linear", "learning_rate": 1.0, "warmup_steps": 3})
    lr = optimizer.learning_rate_schedule(opt, 10, schedule.full_batch_steps)
    # Rows before steps 0, 2, 4, 6: 0, 32, 96, 192; the warmup ends when the tokens of 3 full
    # batches (192 rows) are seen, at step 6, and the decay over 10 full batches begins there.
    assert [round(float(lr(s)), 6) for s in (0, 2, 4, 6)] == [0.0, 0.166667, 0.5, 0.7]


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(tokens=-1), r"^config.train.batch_warmup_tokens=-1: expected >= 0"),
        (dict(tokens=10**6, start=64), r"^config.train.batch_warmup_start=64: expected 1 .. 63"),
        (dict(tokens=10**6, start=8, stages=0), r"^config.train.batch_warmup_stages=0: expected"),
        (dict(tokens=10**6, start=8, stages=8), r"^config.train.batch_warmup_stages=8: the sizes"),
        (dict(tokens=10, start=8, stages=2), r"^config.train.batch_warmup_tokens=10: less than"),
    ],
)
def test_a_warm_up_that_cannot_work_is_one_line_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message) as error:
        batch_schedule.from_config(_config(64, length=128, **fields), 8)
    assert "\n" not in str(error.value)
