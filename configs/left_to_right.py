"""The paper's "LTR & No NSP" ablation (Table 5) on BERT-BASE: a left-to-right language model
(causal attention, the next token predicted at every position, no masking) without NSP.

    python -m bertjax.main --config=configs/left_to_right.py --workdir=DIR
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import bert_base  # noqa: E402


def get_config():
    config = bert_base.get_config()
    config.model.attention = "causal"
    config.data.objective = "ltr"
    config.data.nsp = False
    # Every position is a prediction target.
    config.data.max_predictions_per_seq = config.data.max_seq_length
    config.train.nsp_loss_weight = 0.0
    return config.lock()
