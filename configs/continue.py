"""Continued (domain-adaptive) pretraining of a public BERT checkpoint on your own corpus.

    python -m bertjax.main --config=configs/continue.py --config.init_checkpoint=CKPT \
        --config.data.input_files='domain/*.txt' --config.data.eval_input_files=heldout.txt \
        --workdir=/tmp/domain-bert

CKPT is a HuggingFace BertModel / BertForPreTraining directory, Google's TF1 release or a bertjax
checkpoint or workdir: its architecture, vocab and casing replace this file's model and vocab
(``bertjax.pretrain.continued``). The schedule is the paper's recipe at length 128 with a lower
peak and a short warmup; where each number comes from is docs/continued_pretraining.md.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import base  # noqa: E402


def get_config():
    config = base.get_config()
    # Half the paper's from-scratch peak at the same batch; ClinicalBERT continued BERT and
    # BioBERT with the original code at 5e-5 (batch 32, 100k steps).
    config.optimizer.learning_rate = 5e-5
    # The optimizer state is always fresh: linear warmup over 2 / (1 - beta2) = 2,000 steps for
    # Adam's beta2 = 0.999 (Ma & Yarats, 2021), not the from-scratch 10,000.
    config.optimizer.warmup_steps = 2_000
    # 100k x 256 = 25.6M sequences, the number DAPT (Gururangan et al., 2020) trained RoBERTa
    # on (12.5k steps x 2048).
    config.train.num_steps = 100_000
    config.train.eval_every = 5_000
    config.checkpoint.every_steps = 5_000
    return config.lock()
