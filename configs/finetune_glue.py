"""GLUE fine-tuning (paper §4.1): batch 32, 3 epochs, lr from {5e-5, 4e-5, 3e-5, 2e-5}.

    python -m bertjax.finetune --config=configs/finetune_glue.py --config.task=mrpc \
        --config.data_dir=glue/MRPC --config.init_checkpoint=CKPT --workdir=/tmp/mrpc
"""

import importlib.util
import pathlib


def get_config():
    path = pathlib.Path(__file__).with_name("finetune_base.py")
    spec = importlib.util.spec_from_file_location("finetune_base", path)
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    config = base.get_config()
    config.task = "mrpc"
    return config
