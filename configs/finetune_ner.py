"""CoNLL-2003 NER fine-tuning (paper §5.3): cased vocabulary, label on the first WordPiece.

    python -m bertjax.finetune --config=configs/finetune_ner.py --config.data_dir=CONLL \
        --config.init_checkpoint=CASED_CKPT --workdir=/tmp/ner
"""

import importlib.util
import pathlib


def get_config():
    path = pathlib.Path(__file__).with_name("finetune_base.py")
    spec = importlib.util.spec_from_file_location("finetune_base", path)
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    config = base.get_config()
    config.task = "conll2003"
    config.do_lower_case = "false"  # the paper uses a cased model for NER
    config.learning_rate = 5e-5
    return config
