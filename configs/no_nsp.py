"""The paper's "No NSP" ablation (Table 5) on BERT-BASE: MLM only, segment B always the real
continuation, NSP loss weighted 0 (the NSP head still exists so checkpoints export to HF).

    python -m bertjax.main --config=configs/no_nsp.py --workdir=DIR
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import bert_base  # noqa: E402


def get_config():
    config = bert_base.get_config()
    config.data.nsp = False
    config.train.nsp_loss_weight = 0.0
    return config.lock()
