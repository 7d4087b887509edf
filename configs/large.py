"""BERT-LARGE as in the paper: L=24, H=1024, A=16; otherwise identical to ``bert_base.py``.

On TPU use bf16 compute and remat, e.g. ``--config.model.dtype=bfloat16
--config.model.remat_policy=dots``; FSDP over a pod slice with ``--config.mesh.shape=-1,8,1``.

    python -m bertjax.main --config=configs/large.py --workdir=gs://BUCKET/bert_large
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import bert_base  # noqa: E402


def get_config():
    return bert_base.get_config("large").lock()
