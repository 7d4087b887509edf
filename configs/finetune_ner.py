"""CoNLL-2003 NER fine-tuning (paper §5.3): cased vocabulary, label on the first WordPiece.

    python -m bertjax.finetune --config=configs/finetune_ner.py --config.task.data_dir=CONLL \
        --config.init_checkpoint=CASED_CKPT --workdir=/tmp/ner
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import finetune_base  # noqa: E402


def get_config():
    # The paper uses a cased model for NER.
    config = finetune_base.get_config()
    config.task.name = "conll2003"
    config.data.do_lower_case = False
    config.optimizer.learning_rate = 5e-5
    return config
