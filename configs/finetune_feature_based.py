"""The paper's feature-based approach (§5.3, Table 7) on CoNLL-2003 NER: the cased encoder frozen,
its activations extracted once, one two-layer 768-unit BiLSTM head per layer combination.

    python -m bertjax.finetune --config=configs/finetune_feature_based.py \
        --config.task.data_dir=CONLL --config.init_checkpoint=CASED_CKPT --workdir=/tmp/feature \
        --config.feature_based.layers=all

Any classification task works too (``--config.task.name=sst2``); the keys are in
configs/finetune_base.py's ``feature_based`` section.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import finetune_ner  # noqa: E402


def get_config():
    config = finetune_ner.get_config()
    config.mode = "feature_based"
    # The head starts from scratch on fixed inputs: a BiLSTM's rate, not fine-tuning's 5e-5.
    config.optimizer.learning_rate = 1e-3
    config.feature_based.layers = "all"
    return config
