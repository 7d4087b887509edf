"""Pretraining's part of starting a run: its :class:`bertjax.training.start.Plan`.

The order of a start (lease, read-only checks, restore or init, then the record) is the trainer
core's, ``bertjax.training.start``. What pretraining brings: the run's model, vocab and config for
the record; the base keys (``split(key(config.seed))`` -> init key, training key); and, when this
workdir has no checkpoint, the params of ``config.init_checkpoint``
(``bertjax.pretrain.continued``: the subtrees it has; the trainer core draws the others with the
init key) with a fresh optimizer state. A resume that took its model from the workdir's record
(``continued.Resumed``) reads the init checkpoint here only, when no step restores.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from bertjax.pretrain.continued import Continued, Resumed
from bertjax.pretrain.objective import Steps
from bertjax.training.start import Plan


def initial_params(config, steps: Steps, continued: Continued | Resumed | None):
    """``continued``'s params in the run's param dtypes (None without a checkpoint; a
    :class:`Resumed` reads its checkpoint now); says which heads were loaded and which
    initialised, and that the optimizer starts fresh."""
    if continued is None:
        return None
    if isinstance(continued, Resumed):
        continued = continued.load()
    abstract = steps.trainer.abstract_state.params
    params = {
        name: jax.tree.map(lambda x, a: np.asarray(x, a.dtype), subtree, abstract[name])
        for name, subtree in continued.params.items()
    }
    print(continued.heads_line(steps.bert_config.initializer_range), flush=True)
    optimizer = config.optimizer
    print(
        f"optimizer: a fresh {optimizer.name} state with its own warmup "
        f"({optimizer.warmup_steps} steps to {optimizer.learning_rate:g}); a checkpoint's "
        "optimizer state is never read (docs/continued_pretraining.md says why)",
        flush=True,
    )
    return params


def plan(config, steps: Steps, continued: Continued | Resumed | None = None) -> Plan:
    init_rng, train_rng = jax.random.split(jax.random.key(config.seed))
    return Plan(
        bert_config=steps.bert_config,
        vocab_file="" if config.train.synthetic_data else config.data.vocab_file,
        do_lower_case=bool(config.data.do_lower_case),
        config_json=config.to_json_best_effort(),
        allow_vocab_change=bool(config.allow_vocab_change),
        keep=config.checkpoint.keep,
        keep_every=config.checkpoint.keep_every,
        async_save=bool(config.checkpoint.async_save),
        lease_ttl_seconds=float(config.checkpoint.lease_ttl_seconds),
        lease_renew_seconds=float(config.checkpoint.lease_renew_seconds),
        init_rng=init_rng,
        rng_data=np.asarray(jax.random.key_data(train_rng)),
        initial_params=functools.partial(initial_params, config, steps, continued),
        init=None if continued is None else continued.record,
        from_record=isinstance(continued, Resumed),
    )
