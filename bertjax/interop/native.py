"""bertjax's own formats as :class:`~bertjax.interop.converted.Converted`: params-only
checkpoints (read and written) and training workdirs (read: the newest verified step).

Both layouts, and the verification that comes with reading them, are
``bertjax.training.checkpoint``'s contract; this module only turns their errors into
:class:`~bertjax.interop.converted.ConvertError` and checks the vocab against the embedding.
"""

from __future__ import annotations

import os

from bertjax.interop.converted import Converted, ConvertError, check_vocab
from bertjax.training import checkpoint, checkpoint_manifest, workdir

_EMBEDDING = "encoder/embeddings/word_embeddings/embedding"


def read_checkpoint(src: str) -> Converted:
    """A params-only bertjax checkpoint (verified against its manifest), task record included."""
    try:
        params, cfg, meta = checkpoint.load_params(src)
    except (checkpoint.CheckpointError, checkpoint_manifest.CheckpointCorrupt) as e:
        raise ConvertError(str(e)) from None
    vocab_file = str(checkpoint.vocab_in(src, meta))
    check_vocab(vocab_file, cfg, os.path.join(src, checkpoint.PARAMS_DIR), _EMBEDDING)
    return Converted(params, cfg, vocab_file, bool(meta["do_lower_case"]), meta.get("task"))


def read_workdir(src: str) -> Converted:
    """The newest verified checkpoint of a training workdir (``WORKDIR/checkpoints/``)."""
    try:
        params, cfg, vocab_file, do_lower_case = workdir.latest_params(src)
    except (checkpoint.CheckpointError, checkpoint_manifest.CheckpointCorrupt) as e:
        raise ConvertError(str(e)) from None
    check_vocab(vocab_file, cfg, src, _EMBEDDING)
    return Converted(params, cfg.portable(), vocab_file, bool(do_lower_case))


def write_checkpoint(dst: str, conv: Converted, *, overwrite: bool = False) -> str:
    """``conv`` as a params-only bertjax checkpoint at ``dst`` (its task record too)."""
    try:
        path = checkpoint.save_params(
            dst, conv.params, conv.config, conv.vocab_file, conv.do_lower_case,
            task=conv.task, overwrite=overwrite,
        )  # fmt: skip
    except checkpoint.CheckpointError as e:
        raise ConvertError(str(e)) from None
    return str(path)
