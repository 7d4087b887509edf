"""BERT-BASE as in the paper: L=12, H=768, A=12, batch 256 x 512 tokens, 1M steps.

Adam (original BERT variant: no bias correction) lr 1e-4, beta1 0.9, beta2 0.999, eps 1e-6,
weight decay 0.01 except LayerNorm and biases, 10k warmup then linear decay to 0, dropout 0.1,
tanh GELU, global-norm clipping 1.0, loss = mean MLM + mean NSP. Those are the defaults of
``base.py``; this file sets the sequence length and how it runs on a TPU (below). For the cheaper
two-phase recipe of the original README see ``two_phase.py``.

    python -m bertjax.compile --config=configs/bert_base.py --topology=v5litepod-16
    python -m bertjax.main --config=configs/bert_base.py --workdir=gs://BUCKET/bert_base \\
        --config.data.source=tfrecord --config.data.input_files='gs://BUCKET/tfrecords/*'
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import base  # noqa: E402

from bertjax.model.config import SIZES  # noqa: E402


def get_config(size: str = "base"):
    if size not in SIZES:
        raise ValueError(
            f"configs/bert_base.py: unknown model size {size!r}; known: {sorted(SIZES)}"
        )
    config = base.get_config()
    config.model.update(SIZES[size])
    config.model.max_position_embeddings = 512
    # As they run well on a TPU: bf16 compute with fp32 params and optimizer state; attention
    # 'auto' (the Pallas flash kernel with the paper's attention dropout on TPU); no remat. By
    # the TPU compiler's counts, without remat every paper config fits every slice of
    # docs/benchmarks.md ("Paper configs on TPU slices"), with a roofline bound within 0.5% of the
    # lowest remat policy's ("Fused attention and remat on TPU"); the figures live there only.
    config.model.dtype = "bfloat16"
    config.model.attention_impl = "auto"
    config.model.remat_policy = "none"
    config.data.max_seq_length = 512
    config.data.max_predictions_per_seq = 80  # round(512 * 0.15) rounded up, as the original
    config.train.num_steps = 1_000_000
    config.train.global_batch_size = 256
    config.optimizer.learning_rate = 1e-4
    config.optimizer.warmup_steps = 10_000
    return config
