"""SQuAD fine-tuning (paper §4.2, §4.3). ``:v1`` (default) or ``:v2`` selects the version.

v1.1: 3 epochs, learning rate 5e-5, batch 32; v2.0: 2 epochs, 5e-5, batch 48. Both use
run_squad.py's max_seq_length 384, doc_stride 128, max_query_length 64, n_best 20, max answer 30.

    python -m bertjax.finetune --config=configs/finetune_squad.py:v2 --config.data_dir=SQUAD \
        --config.init_checkpoint=CKPT --workdir=/tmp/squad2
"""

import importlib.util
import pathlib


def get_config(version: str = "v1"):
    path = pathlib.Path(__file__).with_name("finetune_base.py")
    spec = importlib.util.spec_from_file_location("finetune_base", path)
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    config = base.get_config()
    if version not in ("v1", "v2"):
        raise ValueError(f"configs/finetune_squad.py:{version}: expected :v1 or :v2")
    config.task = f"squad_{version}"
    config.max_seq_length = 384
    config.learning_rate = 5e-5
    config.batch_size = 32 if version == "v1" else 48
    config.num_train_epochs = 3.0 if version == "v1" else 2.0
    return config
