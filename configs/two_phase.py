"""The original README's two-phase recipe: 90% of the steps at length 128 with 20 predictions,
then 10% at length 512 with 80, in ONE workdir sharing one learning-rate schedule.

    python -m bertjax.main --config=configs/two_phase.py:base,1 --workdir=DIR   # steps 0..900k
    python -m bertjax.main --config=configs/two_phase.py:base,2 --workdir=DIR   # 900k..1M

Phase 2 restores phase 1's full state (params, optimizer, step) from DIR; its data stream
differs, so it starts at the beginning of the length-512 data. ``decay_steps`` keeps the
schedule of the whole run. The size may be ``base`` or ``large``.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import bert_base  # noqa: E402

TOTAL_STEPS = 1_000_000
PHASE1_STEPS = 900_000


def get_config(arg: str = "base,1"):
    size, phase = arg.split(",")
    if phase not in ("1", "2"):
        raise ValueError(f"configs/two_phase.py: phase must be 1 or 2, got {phase!r}")
    config = bert_base.get_config(size)
    config.optimizer.decay_steps = TOTAL_STEPS
    if phase == "1":
        config.data.max_seq_length = 128
        config.data.max_predictions_per_seq = 20
        config.train.num_steps = PHASE1_STEPS
    else:
        config.data.max_seq_length = 512
        config.data.max_predictions_per_seq = 80
        config.train.num_steps = TOTAL_STEPS
    return config.lock()
