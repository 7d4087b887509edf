"""Every configuration key of bertjax, with its default and what it means.

Variants (tiny.py, base.py-size, large.py, finetune_*.py) import ``get_config`` from here and
override only what differs. Library code reads ``config.x`` and never supplies its own defaults.

    python -m bertjax.main --config=configs/base.py --workdir=/tmp/bert
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0

    # ---- model (owner: model.py; fields of bertjax.model.BertConfig) ----
    config.model = ml_collections.ConfigDict()
    config.model.vocab_size = 30522
    config.model.hidden_size = 768
    config.model.num_layers = 12
    config.model.num_heads = 12
    config.model.intermediate_size = 3072
    config.model.max_position_embeddings = 512
    config.model.type_vocab_size = 2
    config.model.hidden_dropout_rate = 0.1
    config.model.attention_dropout_rate = 0.1
    config.model.hidden_act = "gelu_tanh"  # original BERT's tanh GELU; 'gelu' = exact erf (HF)
    config.model.initializer_range = 0.02
    config.model.layer_norm_eps = 1e-12
    config.model.dtype = "float32"  # compute dtype; 'bfloat16' on TPU
    config.model.param_dtype = "float32"
    config.model.attention = "bidirectional"  # 'causal' = the paper's left-to-right ablation
    config.model.scan_layers = False
    config.model.remat_policy = "none"  # none | full | dots | dots_no_batch

    # ---- data (owner: input_pipeline.py) ----
    config.data = ml_collections.ConfigDict()

    # ---- train / optimizer / checkpoint / mesh / eval / logging (owner: train.py) ----
    config.train = ml_collections.ConfigDict()
    config.optimizer = ml_collections.ConfigDict()
    config.checkpoint = ml_collections.ConfigDict()
    config.mesh = ml_collections.ConfigDict()
    return config
