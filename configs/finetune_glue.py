"""GLUE fine-tuning (paper §4.1): batch 32, 3 epochs, lr from {5e-5, 4e-5, 3e-5, 2e-5}.

    python -m bertjax.finetune --config=configs/finetune_glue.py --config.task.name=mrpc \
        --config.task.data_dir=glue/MRPC --config.init_checkpoint=CKPT --workdir=/tmp/mrpc
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import finetune_base  # noqa: E402


def get_config():
    config = finetune_base.get_config()
    config.task.name = "mrpc"
    return config
