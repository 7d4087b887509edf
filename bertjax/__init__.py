"""bertjax: BERT (Devlin et al., 2018) pretraining and fine-tuning in JAX/Flax, TPU-first.

Layout: one subpackage per stage a batch passes through; each imports only the ones above it.

    data/       text -> batches on the host (tf.data, tensorflow-text; no JAX). The batch
                contract is data/pipeline.py's docstring.
    model/      the network, only the math: BertConfig, encoder, heads, losses; logical axis
                names on every parameter. attention/: the dispatch, the XLA path, the
                counter-hash dropout, the Pallas flash kernels (tpu/, gpu/), the kernel chosen
                when a step is built for its mesh.
    training/   the trainer core both loops run on (train state, the pure step, jit on the mesh,
                start, the host loop, preemption, metrics) and what else they share: mesh and
                sharding, optimizer, checkpoints, workdir, lease, the accelerator table.
    interop/    HF and TF1 checkpoints <-> bertjax as a library. It sits above training because
                it reads and writes training's checkpoint and workdir layouts (and needs the
                model's BertConfig); fine-tuning and continued pretraining read any checkpoint
                through it.
    pretrain/   only what pretraining adds: its objective (MLM + NSP), inputs, continued (a run
                from a checkpoint), start, loop.
    finetune/   only what fine-tuning adds: objective (heads, losses, predictions), inputs,
                loop, sweep, one module per task family; pretrain and finetune are peers and
                never import each other.

The modules at the top level are the commands users type (``python -m bertjax.<name>``, or the
``bertjax-<name>`` console scripts): ``main`` (pretraining), ``finetune``
(``finetune/__main__.py``), ``compile``, ``convert``, ``extract_features``, ``tokenize``,
``vocab``, ``create_pretraining_data``, ``data_stats``: flags and messages only, and no other
module imports them; ``cli`` is what they share. Below every stage, so that any may import
them, sit ``startup`` and ``atomic`` (the one way an output file or directory is written, local
or ``gs://``; it imports only ``etils.epath``). ``tests/layering_test.py`` walks every import
and checks this order.

Importing bertjax sets two environment defaults before JAX and TensorFlow load, unless the user
set them (``bertjax.startup``): JAX_PLATFORMS=cpu on a machine without TPU/GPU device files, and
TF_CPP_MIN_LOG_LEVEL=3.
"""

from bertjax import startup as _startup

_startup.set_platform_defaults()
