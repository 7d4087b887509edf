"""The feature-based approach (paper §5.3, Table 7): task heads trained on a frozen encoder.

``python -m bertjax.finetune --config=configs/finetune_feature_based.py ...`` runs
``config.mode='feature_based'`` (:func:`run`):

1. The task's splits are featurized as for fine-tuning (``bertjax.finetune.inputs.Data``),
   one example per row (``config.data.pack_sequences`` is refused).
2. The encoder of ``config.init_checkpoint`` runs once over each split, and the hidden states
   that the combinations of ``config.feature_based.layers`` read are stored
   (``bertjax.finetune.activations``, in ``config.feature_based.activations_dir`` or
   WORKDIR/activations); a later run on the same encoder and inputs reads them.
3. For each combination, ``config.feature_based.restarts`` heads
   (``bertjax.model.feature_head.FeatureHead``: the combination, a BiLSTM of ``rnn_layers`` x
   ``rnn_size``, the task's classifier), seeded ``config.seed``, ``config.seed + 1``, ..., train
   on those same stored activations, each in its own training workdir,
   WORKDIR/heads/<combination>/seed<seed>/, on the trainer core (``bertjax.training``: the step,
   optimizer, accumulation, non-finite guard, checkpoints, resume, SIGTERM and progress line of
   every run). Its dev metrics and predictions are the task's own (``task.evaluate``,
   ``task.write_predictions``), written there as ``eval_results.json`` and ``predictions/``.
4. WORKDIR/feature_based_results.{json,md}: one row per head, combination by combination:
   ``{"combination", "seed", "hidden_states", "final_train_loss", "dev": {metric: value}}``.

**Frozen**: the trained state holds the head's params only (``layer_mix``, ``bilstm``,
``classifier``); the encoder's are not in it, and its activations come through
``jax.lax.stop_gradient``. The tasks are the token and sentence ones: tagging (NER, the paper's),
classification and regression.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertjax import atomic
from bertjax.finetune import activations, inputs, tasks
from bertjax.finetune import loop as finetune_loop
from bertjax.finetune.objective import FineTuning, Predictor
from bertjax.finetune.tasks import Features, FinetuneInputError
from bertjax.model.bilstm import BiLSTMConfig
from bertjax.model.feature_head import COMBINATIONS, FeatureHead, hidden_state_indices
from bertjax.training import loop as loop_lib
from bertjax.training import sharding as sh

HEADS = ("classification", "regression", "tagging")
RESULTS = "feature_based_results"  # WORKDIR/feature_based_results.{json,md}


def combinations(config) -> tuple[str, ...]:
    """``config.feature_based.layers`` (comma-separated, or 'all') -> combination names."""
    text = config.feature_based.layers
    names = [n.strip() for n in text.split(",") if n.strip()]
    names = list(COMBINATIONS) if names == ["all"] else names
    bad = [n for n in names if n not in COMBINATIONS]
    if bad or not names:
        raise FinetuneInputError(
            f"config.feature_based.layers={text!r}: expected a comma-separated list of "
            f"{', '.join(COMBINATIONS)}, or 'all'"
        )
    return tuple(dict.fromkeys(names))


def check(config, task) -> None:
    """A one-line FinetuneInputError naming the field for what the trainer does not do."""
    if task.head not in HEADS:
        raise FinetuneInputError(
            f"config.task.name={config.task.name!r}: the feature-based trainer has heads for "
            f"{', '.join(HEADS)} tasks, not {task.head}"
        )
    if config.data.pack_sequences:
        raise FinetuneInputError(
            "config.data.pack_sequences: the feature-based trainer stores one example per row "
            "(its heads read the stored activations unpacked); set it to False"
        )
    if config.model.scan_layers:  # the stored states and their key are of the unscanned layout
        raise FinetuneInputError(
            "config.model.scan_layers: the feature-based trainer runs the encoder once, "
            "unscanned; set it to False"
        )
    for field in ("rnn_size", "rnn_layers", "restarts"):
        value = config.feature_based[field]
        if not isinstance(value, int) or value < 1:
            raise FinetuneInputError(
                f"config.feature_based.{field}={value!r}: expected a positive integer"
            )


@dataclasses.dataclass(frozen=True)
class FeatureBased(FineTuning):
    """The ``bertjax.training.step.Objective`` of a head on stored activations: fine-tuning's
    loss and weights (``FineTuning``) on the head's logits. ``input_shape`` is (J, L, H)."""

    @property
    def input_keys(self) -> tuple[str, ...]:
        return ("activations", "input_mask")

    def init(self, rng):
        layers = jnp.zeros((1, *self.input_shape), jnp.float32)
        mask = jnp.ones((1, self.input_shape[1]), jnp.int32)
        return self.model.init(rng, layers, mask)["params"]

    def logits(self, params, batch, dropout_rng=None) -> jax.Array:
        return self.model.apply(
            {"params": params},
            batch["activations"],
            batch["input_mask"],
            deterministic=dropout_rng is None,
            rngs=None if dropout_rng is None else {"dropout": dropout_rng},
        )


def objective_for(config, task, combination: str, bert_config, length: int) -> FeatureBased:
    rnn = BiLSTMConfig(int(config.feature_based.rnn_size), int(config.feature_based.rnn_layers))
    per_token = task.head == "tagging"
    model = FeatureHead(bert_config, combination, rnn, task.num_labels, per_token)
    count = len(hidden_state_indices(combination, bert_config.num_layers))
    return FeatureBased(model, task.head, (count, length, bert_config.hidden_size))


def split_features(features: Features, layers: activations.Layers) -> Features:
    """A split's features with its ``activations`` <float32>[N, J, L, H] beside them."""
    arrays = {**features.arrays, "activations": layers}
    return Features(arrays, features.meta, features.skipped)


def head_flops(objective: FeatureBased) -> float:
    """The head's FLOPs per row, forward and backward (3x): the BiLSTM's matmuls, L steps."""
    count, length, hidden = objective.input_shape
    rnn = objective.model.rnn
    width = count * hidden if objective.model.combination.endswith("_concat") else hidden
    flops = 0.0
    for _ in range(rnn.num_layers):
        flops += 2 * 2 * 4 * rnn.hidden_size * (width + rnn.hidden_size)  # 2 directions
        width = 2 * rnn.hidden_size
    return 3.0 * length * flops


def fit_head(config, objective: FeatureBased, train: Features, mesh, *, workdir: str, seed: int,
             signature: dict, bert_config, vocab_file: str, lower: bool):  # fmt: skip
    """Trains a fresh head from ``seed`` in its training workdir (resuming its newest verified
    step of the same ``signature``) -> ``bertjax.finetune.loop.Fitted``."""
    batch_size = int(config.train.global_batch_size)
    num_steps = int(len(train) / batch_size * config.train.num_epochs)
    opt_config = ml_collections.ConfigDict(config.optimizer.to_dict())
    opt_config.warmup_steps = int(num_steps * config.optimizer.warmup_proportion)
    train_batch = {k: jax.ShapeDtypeStruct((batch_size, *v.shape[1:]), v.dtype)
                   for k, v in train.arrays.items()}  # fmt: skip
    train_batch["example_weights"] = jax.ShapeDtypeStruct((batch_size,), np.float32)
    run = finetune_loop.Run(
        workdir=workdir, signature={**signature, "num_steps": num_steps}, seed=seed,
        bert_config=bert_config, vocab_file=vocab_file, lower=lower,
        report=loop_lib.Report(objective.input_shape[1], head_flops(objective)),
    )  # fmt: skip
    return finetune_loop.train(config, objective, train_batch, train, mesh, opt_config, num_steps,
                               run)  # fmt: skip


def seeds(config) -> tuple[int, ...]:
    """Each combination's head seeds: ``config.seed`` and the next ``restarts - 1``."""
    return tuple(int(config.seed) + k for k in range(int(config.feature_based.restarts)))


def _signature(config, task, combination: str, train_key: str, seed: int) -> dict:
    """What a resumed head's run must share with the run that saved its checkpoints."""
    return {
        "task": task.name,
        "combination": combination,
        "activations": train_key,  # the encoder and the train split (activations.key_of)
        "rnn": f"{config.feature_based.rnn_size}x{config.feature_based.rnn_layers}",
        "learning_rate": float(config.optimizer.learning_rate),
        "seed": seed,
        "batch_size": int(config.train.global_batch_size),
    }


def _table(rows: list[dict]) -> str:
    metric_names = sorted({k for r in rows for k, v in r["dev"].items() if isinstance(v, float)})
    header = ["combination", "seed", "hidden states", "final_train_loss", *metric_names]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["combination"], str(row["seed"]), " ".join(map(str, row["hidden_states"])),
                 f"{row['final_train_loss']:.4f}"]  # fmt: skip
        cells += [f"{row['dev'].get(m, float('nan')):.2f}" for m in metric_names]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\nhidden states: 0 = the embeddings' output, j = layer j's\n"


def combination_layers(store: activations.Layers, indices, combination: str,
                       num_layers: int) -> activations.Layers:  # fmt: skip
    """The hidden states ``combination`` reads (shallowest first) out of a split's ``store``,
    which holds the hidden states ``indices``, in that order."""
    wanted = hidden_state_indices(combination, num_layers)
    return activations.Layers([store.files[list(indices).index(j)] for j in wanted])


def _stored_splits(config, workdir: str, encoder, data, indices) -> dict:
    """{split: activations.Layers} of every split, extracted once (``activations.stored``)."""
    root = config.feature_based.activations_dir or os.path.join(workdir, "activations")
    return {
        split: activations.stored(
            os.path.join(root, split),
            encoder,
            features.arrays,
            indices,
            int(config.train.eval_batch_size),
        )
        for split, features in data.features.items()
    }


def run(config, workdir: str) -> dict:
    """Extracts once, trains ``restarts`` heads per combination, writes the module docstring's
    outputs; -> {"rows": [...]} (or {"stopped": True} after SIGTERM/Ctrl-C, to be resumed)."""
    names = combinations(config)
    check(config, tasks.get_task(config))  # before the checkpoint and the data are read
    head_seeds = seeds(config)
    task, pretrained, bert_config, vocab_file, lower, tokenizer = inputs.prepare(config)
    mesh = sh.create_mesh(config.mesh.shape)
    finetune_loop.check_batches(config, mesh)
    data = inputs.Data(task, config, tokenizer, [task.train_split, *task.dev_splits])
    encoder = activations.Encoder.of(pretrained.params()["encoder"], bert_config)
    wanted = sorted({j for n in names for j in hidden_state_indices(n, bert_config.num_layers)})
    stored = _stored_splits(config, workdir, encoder, data, tuple(wanted))
    train_key = activations.key_of(encoder, data.features[task.train_split].arrays)
    length = int(config.data.max_seq_length)
    rows = []
    for name in names:
        layers = {
            split: combination_layers(store, wanted, name, bert_config.num_layers)
            for split, store in stored.items()
        }
        objective = objective_for(config, task, name, bert_config, length)
        train = split_features(data.features[task.train_split], layers[task.train_split])
        indices = hidden_state_indices(name, bert_config.num_layers)
        for seed in head_seeds:
            head_dir = os.path.join(workdir, "heads", name, f"seed{seed}")
            print(f"feature-based head {name} seed {seed}: hidden states {list(indices)}",
                  flush=True)  # fmt: skip
            fitted = fit_head(
                config, objective, train, mesh, workdir=head_dir, seed=seed,
                signature=_signature(config, task, name, train_key, seed),
                bert_config=bert_config, vocab_file=vocab_file, lower=lower,
            )  # fmt: skip
            if fitted.stopped:
                print(f"stopped: rerun the same command to resume in {head_dir}", flush=True)
                return {"stopped": True}
            rows.append(
                _evaluate(config, task, objective, fitted, data, layers, head_dir, name, seed)
            )
    finetune_loop.write_json(os.path.join(workdir, f"{RESULTS}.json"), {"rows": rows})
    atomic.write_text(os.path.join(workdir, f"{RESULTS}.md"), _table(rows))
    return {"rows": rows}


def _evaluate(config, task, objective, fitted, data, layers, head_dir: str, name: str,
              seed: int) -> dict:  # fmt: skip
    """Dev metrics and predictions of a trained head, written into its workdir; -> its row."""
    predictor = Predictor(objective, fitted.mesh, config.mesh.rules,
                          config.train.eval_batch_size)  # fmt: skip
    dev = {}
    out_dir = os.path.join(head_dir, "predictions")
    os.makedirs(out_dir, exist_ok=True)
    for split in task.dev_splits:
        features = split_features(data.features[split], layers[split])
        logits = predictor.logits(fitted.params, features)
        dev[split], _ = task.evaluate(data.examples[split], features, logits)
        task.write_predictions(out_dir, split, data.examples[split], features, logits)
        values = " ".join(f"{k} {v:.4f}" for k, v in dev[split].items() if isinstance(v, float))
        print(f"eval {name} seed {seed} {split}: {values}", flush=True)
    indices = hidden_state_indices(name, objective.model.config.num_layers)
    first = dev[task.dev_splits[0]]
    row = {"combination": name, "seed": seed, "hidden_states": list(indices),
           "final_train_loss": fitted.final_loss, "dev": first}  # fmt: skip
    finetune_loop.write_json(os.path.join(head_dir, "eval_results.json"),
                             {"task": task.name, **row, "dev_splits": dev})  # fmt: skip
    return row
