"""Logical axis names: the model's half of the sharding contract.

Every parameter of the model carries logical axis names from ``PARAM_AXES`` and every large
activation is constrained with ``ACTIVATION_AXES``; no model module names a mesh axis. The other
half, mesh axes and the logical -> mesh rules (which live in config), is
``bertjax.training.sharding``.
"""

# Parameter axes.
VOCAB = "vocab"
EMBED = "embed"
HEADS = "heads"
KV = "kv"
MLP = "mlp"
LAYERS = "layers"
RNN = "rnn"  # a BiLSTM head's units (bertjax.model.bilstm)
PARAM_AXES = (VOCAB, EMBED, HEADS, KV, MLP, LAYERS, RNN)

# Activation axes.
ACT_BATCH = "act_batch"
ACT_LENGTH = "act_length"
ACT_EMBED = "act_embed"
ACT_HEADS = "act_heads"
ACT_MLP = "act_mlp"
ACTIVATION_AXES = (ACT_BATCH, ACT_LENGTH, ACT_EMBED, ACT_HEADS, ACT_MLP)
