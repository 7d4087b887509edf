"""Google's original TF1 BERT release -> :class:`~bertjax.interop.converted.Converted`.

A directory with ``bert_config.json``, ``bert_model.ckpt.{index,data-*}`` (or any single
``*.ckpt*.index``), ``vocab.txt``; or the checkpoint prefix itself. The original code's
``hidden_act: gelu`` is the *tanh* approximation (bertjax ``gelu_tanh``). Weights are the
encoder, pooler, MLM and NSP heads under the original names (``bertjax.interop.mapping``); only
the optimizer slots ``*/adam_m``, ``*/adam_v`` and ``global_step`` are ignored. The release does
not record its casing: the caller passes it, or asks for the casing its vocab implies. On
``gs://``, TensorFlow's own file system reads the checkpoint (``tf.train.load_checkpoint``).
"""

from __future__ import annotations

import os

from etils import epath

from bertjax.interop import mapping
from bertjax.interop.converted import (
    Converted,
    ConvertError,
    check_vocab,
    read_json,
    require_casing,
)

_OPTIMIZER_SLOTS = ("/adam_m", "/adam_v")


def checkpoint_prefix(src: str) -> str:
    """``src`` as a checkpoint prefix: itself, or the one ``*.ckpt*.index`` in directory ``src``."""
    if epath.Path(src + ".index").exists():
        return src
    if not src or not epath.Path(src).is_dir():
        raise ConvertError(f"{src}: no such TF1 checkpoint directory or prefix")
    names = (p.name for p in epath.Path(src).iterdir())
    indexes = sorted(f for f in names if ".ckpt" in f and f.endswith(".index"))
    if len(indexes) != 1:
        raise ConvertError(
            f"{src}: expected one TF1 checkpoint (bert_model.ckpt.index), found {indexes or 'none'}"
        )
    return os.path.join(src, indexes[0][: -len(".index")])


def read(src: str, do_lower_case: bool | None = None, casing_from_vocab: bool = False) -> Converted:
    """Google's original TF1 BERT checkpoint (directory or ckpt prefix) -> :class:`Converted`
    (casing: ``do_lower_case``, else with ``casing_from_vocab`` what the vocab implies)."""
    from bertjax import startup  # noqa: PLC0415 - TensorFlow is heavy; only TF1 needs it

    tf = startup.import_tensorflow()

    prefix = checkpoint_prefix(src)
    directory = src if epath.Path(src).is_dir() else os.path.dirname(prefix)
    config_path = os.path.join(directory, "bert_config.json")
    cfg = mapping.config_from_json(read_json(config_path), config_path, mapping.TF1_ACT)
    try:
        reader = tf.train.load_checkpoint(prefix)
    except Exception as e:  # noqa: BLE001 - TF raises a zoo of errors; name the file instead.
        raise ConvertError(f"{prefix}: unreadable TF checkpoint ({type(e).__name__})") from None
    names = [
        n
        for n in reader.get_variable_to_shape_map()
        if n != "global_step" and not n.endswith(_OPTIMIZER_SLOTS)
    ]
    try:
        tensors = {n: reader.get_tensor(n) for n in names}
    except Exception as e:  # noqa: BLE001
        raise ConvertError(
            f"{prefix}: unreadable TF checkpoint data ({type(e).__name__})"
        ) from None
    params = mapping.to_params(tensors, cfg, "tf1", prefix)
    vocab_file = os.path.join(directory, "vocab.txt")
    check_vocab(vocab_file, cfg, prefix, "bert/embeddings/word_embeddings")
    casing = require_casing(do_lower_case, directory, vocab_file if casing_from_vocab else None)
    return Converted(params, cfg, vocab_file, casing)
