"""SWAG fine-tuning (paper §4.4): 3 epochs, learning rate 2e-5, batch 16, 4 choices.

    python -m bertjax.finetune --config=configs/finetune_swag.py --config.task.data_dir=SWAG \
        --config.init_checkpoint=CKPT --workdir=/tmp/swag
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import finetune_base  # noqa: E402


def get_config():
    config = finetune_base.get_config()
    config.task.name = "swag"
    config.optimizer.learning_rate = 2e-5
    config.train.global_batch_size = 16
    config.train.eval_batch_size = 16
    return config
