"""bertjax: BERT (Devlin et al., 2018) pretraining and fine-tuning in JAX/Flax, TPU-first.

Layout: one subpackage per stage a batch passes through; each imports only the ones above it.

    data/       text -> batches on the host (tf.data, tensorflow-text; no JAX). The batch
                contract is data/pipeline.py's docstring.
    model/      the network, only the math: BertConfig, encoder, heads, losses; logical axis
                names on every parameter. attention/: the dispatch, the XLA path, the
                counter-hash dropout, the Pallas flash kernels (tpu/, gpu/), the kernel chosen
                when a step is built for its mesh.
    training/   what both loops share: mesh and sharding, optimizer, checkpoints, metrics,
                the accelerator table.
    pretrain/   step (pure train/eval steps, jitted once), inputs (checks, batches), loop (host).
    finetune/   the same shape (step, inputs, loop) plus one module per task family.

The modules at the top level are the commands users type (``python -m bertjax.<name>``, or the
``bertjax-<name>`` console scripts): ``main`` (pretraining), ``finetune``, ``compile``,
``convert``, ``extract_features``, ``tokenize``, ``vocab``, ``create_pretraining_data``,
``data_stats``; ``cli`` and ``startup`` are what they share.

Importing bertjax sets two environment defaults before JAX and TensorFlow load, unless the user
set them (``bertjax.startup``): JAX_PLATFORMS=cpu on a machine without TPU/GPU device files, and
TF_CPP_MIN_LOG_LEVEL=3.
"""

from bertjax import startup as _startup

_startup.set_platform_defaults()
