"""SWAG fine-tuning (paper §4.4): 3 epochs, learning rate 2e-5, batch 16, 4 choices.

    python -m bertjax.finetune --config=configs/finetune_swag.py --config.data_dir=SWAG \
        --config.init_checkpoint=CKPT --workdir=/tmp/swag
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import finetune_base  # noqa: E402


def get_config():
    return finetune_base.get_config(
        task="swag", learning_rate=2e-5, batch_size=16, eval_batch_size=16
    )
