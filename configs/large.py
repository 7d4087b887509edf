"""BERT-LARGE as in the paper: L=24, H=1024, A=16; otherwise identical to ``bert_base.py``
(bf16 compute, fp32 params, the fused attention kernel on TPU, data-parallel mesh).

Check a slice first (on any machine with libtpu), then train:

    python -m bertjax.compile --config=configs/large.py --topology=v5litepod-16
    python -m bertjax.main --config=configs/large.py --workdir=gs://BUCKET/bert_large \
        --config.data.source=tfrecord --config.data.input_files='gs://BUCKET/tfrecords/*'
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import bert_base  # noqa: E402


def get_config():
    return bert_base.get_config("large").lock()
