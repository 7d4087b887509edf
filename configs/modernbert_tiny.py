"""A tiny ModernBERT (the 'modernbert' architecture: 2 layers, hidden 128, one local layer with a
32-token window, a GLU of 344: about the parameters of tiny.py's 512-wide MLP) trained with its
recipe (MLM at 30% without NSP on packed rows, StableAdamW, a 1-sqrt cooldown, a batch-size
warm-up from 16 sequences over its first ~100k tokens) on the bundled corpus and vocab, as
``configs/tiny.py`` trains BERT; minutes on a laptop CPU.

    python -m bertjax.main --config=configs/modernbert_tiny.py --workdir=/tmp/modernbert_tiny
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import tiny  # noqa: E402


def get_config():
    config = tiny.get_config().unlock()
    config.model.update(
        architecture="modernbert", hidden_act="gelu", head_act="gelu", layer_norm_eps=1e-5,
        global_attn_every_n_layers=2, local_attention=32, global_rope_theta=10_000.0,
        local_rope_theta=10_000.0, intermediate_size=344, hidden_dropout_rate=0.0,
        attention_dropout_rate=0.0,
    )  # fmt: skip
    config.data.nsp = False
    config.train.nsp_loss_weight = 0.0
    config.data.masked_lm_prob = 0.3
    config.data.max_predictions_per_seq = 20  # 30% of 64
    config.data.pack_sequences = True
    config.train.update(batch_warmup_tokens=100_000, batch_warmup_start=16, batch_warmup_stages=3)
    config.optimizer.update(
        name="stable_adamw", beta2=0.98, weight_decay=1e-5, fully_decoupled_decay=True,
        max_grad_norm=0.0, schedule="wsd", cooldown_steps=200, cooldown_shape="1-sqrt",
    )  # fmt: skip
    return config.lock()
