"""Pretraining's part of starting a run: its :class:`bertjax.training.start.Plan`.

The order of a start (lease, read-only checks, restore or init, then the record) is the trainer
core's, ``bertjax.training.start``. What pretraining brings: the run's model, vocab and config for
the record; the base keys (``split(key(config.seed))`` -> init key, training key); and, when this
workdir has no checkpoint, ``config.init_checkpoint``'s params (verified; its vocab fingerprint
against ``config.data.vocab_file``) with a fresh optimizer state.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from etils import epath

from bertjax.pretrain.objective import Steps
from bertjax.training import checkpoint
from bertjax.training.start import Plan


def initial_params(config, steps: Steps):
    """``config.init_checkpoint``'s params (verified, vocab checked), or None."""
    if not config.init_checkpoint:
        return None
    abstract = steps.trainer.abstract_state.params
    params, _, meta = checkpoint.load_params(
        config.init_checkpoint, scan_layers=config.model.scan_layers
    )
    if set(params) != set(abstract):
        raise checkpoint.CheckpointError(
            f"config.init_checkpoint={config.init_checkpoint}: has heads {sorted(params)}, "
            f"pretraining needs {sorted(abstract)}"
        )
    vocab = str(epath.Path(config.init_checkpoint) / checkpoint.VOCAB_FILE)
    recorded = meta.get("vocab") or checkpoint.vocab_fingerprint(vocab)
    if not config.train.synthetic_data and not config.allow_vocab_change:
        checkpoint.compare_vocab(recorded, vocab, config.data.vocab_file, "config.data.vocab_file")
    rows = params["encoder"]["embeddings"]["word_embeddings"]["embedding"].shape[0]
    if rows != steps.bert_config.vocab_size:
        raise checkpoint.CheckpointError(
            f"config.init_checkpoint={config.init_checkpoint} has a {rows}-entry vocab "
            f"({vocab}), config.model.vocab_size={steps.bert_config.vocab_size}: sizes differ"
        )
    print(f"initialised params from {config.init_checkpoint}", flush=True)
    return params


def plan(config, steps: Steps) -> Plan:
    init_rng, train_rng = jax.random.split(jax.random.key(config.seed))
    return Plan(
        bert_config=steps.bert_config,
        vocab_file="" if config.train.synthetic_data else config.data.vocab_file,
        do_lower_case=bool(config.data.do_lower_case),
        config_json=config.to_json_best_effort(),
        allow_vocab_change=bool(config.allow_vocab_change),
        keep=int(config.checkpoint.keep),
        async_save=bool(config.checkpoint.async_save),
        lease_ttl_seconds=float(config.checkpoint.lease_ttl_seconds),
        lease_renew_seconds=float(config.checkpoint.lease_renew_seconds),
        init_rng=init_rng,
        rng_data=np.asarray(jax.random.key_data(train_rng)),
        initial_params=functools.partial(initial_params, config, steps),
    )
