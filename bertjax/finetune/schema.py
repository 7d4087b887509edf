"""Fine-tuning's config schema: pretraining's sections, and where each key of the old flat one went.

``configs/finetune_base.py`` lists every key with its default, in pretraining's sections
(``model``, ``data``, ``train``, ``optimizer``, ``checkpoint``, ``mesh``) plus ``task`` (what only
a task has), ``sweep`` and ``feature_based`` (the feature-based trainer's). The flat schema of
earlier versions is gone, with no aliases: a flag or a config file that still uses one of its
keys is one line naming the new key (``bertjax.cli`` asks :func:`new_key` for flags and
:func:`moved` for a config file's error). Plain Python: the command imports it before its flags
are parsed.
"""

from __future__ import annotations

import re

# Old flat key -> its key now (under config.).
RENAMED = {
    "task": "task.name",
    "data_dir": "task.data_dir",
    "data_source": "task.source",
    "tfds_data_dir": "task.tfds_data_dir",
    "predict_checkpoint": "task.predict_checkpoint",
    "doc_stride": "task.doc_stride",
    "max_query_length": "task.max_query_length",
    "n_best_size": "task.n_best_size",
    "max_answer_length": "task.max_answer_length",
    "null_score_diff_threshold": "task.null_score_diff_threshold",
    "max_seq_length": "data.max_seq_length",
    "do_lower_case": "data.do_lower_case",
    "pack_sequences": "data.pack_sequences",
    "max_sequences_per_pack": "data.max_sequences_per_pack",
    "batch_size": "train.global_batch_size",
    "eval_batch_size": "train.eval_batch_size",
    "num_train_epochs": "train.num_epochs",
    "log_every_steps": "train.log_every",
    "grad_accum_steps": "train.grad_accum_steps",
    "skip_nonfinite": "train.skip_nonfinite",
    "peak_flops": "train.peak_flops",
    "learning_rate": "optimizer.learning_rate",
    "warmup_proportion": "optimizer.warmup_proportion",
    "optimizer.warmup_steps": "optimizer.warmup_proportion",
}


def new_key(key: str) -> str | None:
    """``config.``-relative ``key`` of the old schema -> its key now, or None if it is current."""
    return RENAMED.get(key)


def moved(message: str) -> str | None:
    """For a config file's error that quotes a key of the old schema (``get_config() got an
    unexpected keyword argument 'batch_size'``, a locked config's ``Key "batch_size" does not
    exist``): ``config.OLD is config.NEW now (...)``; else None."""
    for quoted in re.findall(r"[\"']([a-z_.]+)[\"']", message):
        if quoted in RENAMED:
            return (f"config.{quoted} is config.{RENAMED[quoted]} now (fine-tuning configs use "
                    "pretraining's sections; configs/finetune_base.py lists them)")  # fmt: skip
    return None
