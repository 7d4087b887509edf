"""CoNLL-2003 NER fine-tuning (paper §5.3): cased vocabulary, label on the first WordPiece.

    python -m bertjax.finetune --config=configs/finetune_ner.py --config.data_dir=CONLL \
        --config.init_checkpoint=CASED_CKPT --workdir=/tmp/ner
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import finetune_base  # noqa: E402


def get_config():
    # The paper uses a cased model for NER.
    return finetune_base.get_config(task="conll2003", do_lower_case="false", learning_rate=5e-5)
