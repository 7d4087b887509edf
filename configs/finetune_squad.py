"""SQuAD fine-tuning (paper §4.2, §4.3). ``:v1`` (default) or ``:v2`` selects the version.

v1.1: 3 epochs, learning rate 5e-5, batch 32; v2.0: 2 epochs, 5e-5, batch 48. Both use
run_squad.py's max_seq_length 384, doc_stride 128, max_query_length 64, n_best 20, max answer 30.

    python -m bertjax.finetune --config=configs/finetune_squad.py:v2 --config.task.data_dir=SQUAD \
        --config.init_checkpoint=CKPT --workdir=/tmp/squad2
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import finetune_base  # noqa: E402


def get_config(version: str = "v1"):
    if version not in ("v1", "v2"):
        raise ValueError(f"configs/finetune_squad.py:{version}: expected :v1 or :v2")
    config = finetune_base.get_config()
    config.task.name = f"squad_{version}"
    config.data.max_seq_length = 384
    config.optimizer.learning_rate = 5e-5
    config.train.global_batch_size = 32 if version == "v1" else 48
    config.train.num_epochs = 3.0 if version == "v1" else 2.0
    return config
