"""ModernBERT (Warner et al., 2024) pretrained as its recipe does, in two phases sharing a workdir:

    python -m bertjax.main --config=configs/modernbert_base.py:base,1 --workdir=DIR  # 1,024 tokens
    python -m bertjax.main --config=configs/modernbert_base.py:base,2 --workdir=DIR  # 8,192 tokens

The size is ``base`` or ``large`` (ModernBERT's) or an Ettin size (``ettin-17m`` .. ``ettin-1b``,
``bertjax.model.config.MODERN_SIZES``). Phase 1 follows AnswerDotAI/ModernBERT's
``yamls/modernbert/modernbert-base-pretrain.yaml``: the 'modernbert' architecture with both RoPE
bases at 10,000 and a 128-token window on two layers of three; MLM at 30% (80/10/10, [CLS] and
[SEP] never masked) without NSP, on packed rows of 1,024 tokens; 4,608 rows a step (its
packed sequences: ``train.batch_unit='rows'``, so a step holds 4.7M token slots at either
length, where BERT's configs count instances);
StableAdamW with fully decoupled weight decay (lr 8e-4, betas 0.9 / 0.98, eps 1e-6, decay 1e-5,
none on norms or biases); a warmup of 3B tokens (636 steps) and no decay before the run's
1.719T tokens (364,300 steps); a batch-size warm-up from 768 rows over the first 50B tokens
(``bertjax.training.batch_schedule``: in 5 sizes, 768 .. 3,840, each compiled once, where the
yaml steps by its 96-sequence micro-batch; the learning-rate schedule then counts full-batch
steps, so its warmup still spans 3B tokens). Phase 2 extends the context to 8,192 tokens with
the global RoPE base raised to 160,000 (the released config's), resuming phase 1's whole
state, and cools the learning rate down to 0 with the 1-sqrt shape over its steps; set its
length with ``--config.train.num_steps``.

Where bertjax differs from that recipe: one ``model.attention_dropout_rate`` for the
probabilities and the attention output, as transformers' ModernBERT has (the yaml drops 10% of
the output only: set 0 here); the tokenizer is the data's (WordPiece by default), not
ModernBERT's BPE; ``train.num_steps`` counts updates, and the batch-size warm-up's smaller
batches make 364,300 of them hold fewer than 1.719T tokens (the run prints its warm-up's steps
and tokens at start: add the difference to ``--config.train.num_steps`` to hold them all).
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import base  # noqa: E402

from bertjax.model.config import MODERN_SIZES  # noqa: E402

PHASE1_STEPS = 364_300  # 1.719T tokens / (4,608 x 1,024)
SIZES = {"base": "modernbert-base", "large": "modernbert-large"}


def get_config(arg: str = "base,1"):
    size, _, phase = arg.partition(",")
    name = SIZES.get(size, size)
    if name not in MODERN_SIZES:
        raise ValueError(
            f"configs/modernbert_base.py: unknown size {size!r}; known: "
            f"{sorted(SIZES) + sorted(n for n in MODERN_SIZES if n.startswith('ettin'))}"
        )
    if phase not in ("1", "2"):
        raise ValueError(f"configs/modernbert_base.py: phase must be 1 or 2, got {phase!r}")
    config = base.get_config()
    config.model.update(MODERN_SIZES[name])
    config.model.update(
        hidden_act="gelu", head_act="gelu", layer_norm_eps=1e-5, hidden_dropout_rate=0.0,
        attention_dropout_rate=0.0, global_rope_theta=10_000.0, local_rope_theta=10_000.0,
        dtype="bfloat16",
    )  # fmt: skip
    config.data.nsp = False
    config.train.nsp_loss_weight = 0.0
    config.data.masked_lm_prob = 0.3
    config.data.pack_sequences = True
    # 4,608 packed rows of max_seq_length tokens (its SequencePacker's out_batch_size pseqs), and
    # the warm-up's 768 too: tokens per step are fixed, whatever the documents' lengths.
    config.train.batch_unit = "rows"
    config.train.global_batch_size = 4608
    if phase == "1":
        config.train.update(batch_warmup_tokens=50_000_000_000, batch_warmup_start=768,
                            batch_warmup_stages=5)  # fmt: skip
    config.optimizer.update(
        name="stable_adamw", learning_rate=8e-4, beta1=0.9, beta2=0.98, eps=1e-6,
        weight_decay=1e-5, fully_decoupled_decay=True, max_grad_norm=0.0, warmup_steps=636,
    )  # fmt: skip
    if phase == "1":
        config.data.max_seq_length = 1024
        config.train.num_steps = PHASE1_STEPS
        config.optimizer.schedule = "constant"
    else:
        config.data.max_seq_length = 8192
        config.model.max_position_embeddings = 8192
        config.model.global_rope_theta = 160_000.0
        config.train.num_steps = PHASE1_STEPS + 60_000
        config.optimizer.update(schedule="wsd", cooldown_shape="1-sqrt", warmup_steps=636)
        # The cooldown is phase 2, whatever --config.train.num_steps makes its length.
        config.optimizer.cooldown_steps = config.train.get_ref("num_steps") - PHASE1_STEPS
    config.data.max_predictions_per_seq = round(config.data.max_seq_length * 0.3)
    return config.lock()
