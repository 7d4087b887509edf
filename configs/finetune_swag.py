"""SWAG fine-tuning (paper §4.4): 3 epochs, learning rate 2e-5, batch 16, 4 choices.

    python -m bertjax.finetune --config=configs/finetune_swag.py --config.data_dir=SWAG \
        --config.init_checkpoint=CKPT --workdir=/tmp/swag
"""

import importlib.util
import pathlib


def get_config():
    path = pathlib.Path(__file__).with_name("finetune_base.py")
    spec = importlib.util.spec_from_file_location("finetune_base", path)
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    config = base.get_config()
    config.task = "swag"
    config.learning_rate = 2e-5
    config.batch_size = 16
    config.eval_batch_size = 16
    return config
