"""Fine-tuning's objective on the trainer core: a task head, its loss, and predictions.

The train step, its state, shardings, accumulation and non-finite guard are the trainer core's
(``bertjax.training.step``, ``bertjax.training.compiled``), as in pretraining: the params are
sharded by their logical axes through ``config.mesh.rules`` over the ``('data', 'fsdp',
'tensor')`` mesh of ``config.mesh.shape``; batches are split over ``('data', 'fsdp')``.

Losses (``task_loss``) are those of run_classifier.py / run_squad.py, as sums over the batch's
examples divided by a count over the whole global batch (so accumulation gives the same update):
softmax cross entropy per example (classification, multiple choice), squared error (regression),
the mean of the start and end cross entropies (spans), cross entropy per first word piece
(tagging). Padded examples carry ``example_weights`` 0. Packed rows (``bertjax.finetune.packed``:
``FineTuning.packed``) carry the packed row's ``instance_weights`` <float32>[B, K], one per
example, and give the same sums over the same examples.

:class:`Predictor` runs the model over every feature of a split, in order: every process holds the
whole (small) split and places only the shards of its own devices
(``bertjax.training.sharding.put_global``); with packing it packs the split, runs the rows and
unpacks the outputs, so the tasks' metrics and predictions read the unpacked layout.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bertjax.finetune import packed as packed_lib
from bertjax.finetune.tasks import FinetuneInputError
from bertjax.model import heads, losses
from bertjax.model.attention import self_check
from bertjax.model.bilstm import BiLSTMConfig
from bertjax.model.config import BertConfig
from bertjax.training import compiled
from bertjax.training import sharding as sh

MODEL_INPUTS = ("input_ids", "segment_ids", "input_mask")
HEAD_RNNS = ("none", "bilstm")  # config.model.head_rnn


def head_rnn(config, bert_config: BertConfig) -> BiLSTMConfig | None:
    """The BiLSTM ``config.model.head_rnn`` puts between the encoder and the task head
    (``bertjax.model.heads``' module docstring), or None; ``head_rnn_size`` 0 is the encoder's
    hidden size. A FinetuneInputError naming the field for anything else."""
    model = config.model
    if model.head_rnn not in HEAD_RNNS:
        raise FinetuneInputError(
            f"config.model.head_rnn={model.head_rnn!r}: expected one of {HEAD_RNNS}"
        )
    if model.head_rnn == "none":
        return None
    if model.head_rnn_size < 0:
        raise FinetuneInputError(
            f"config.model.head_rnn_size={model.head_rnn_size}: expected units per direction, "
            "or 0 for the encoder's hidden size"
        )
    if model.head_rnn_layers < 1:
        raise FinetuneInputError(
            f"config.model.head_rnn_layers={model.head_rnn_layers}: expected a positive integer"
        )
    size = int(model.head_rnn_size) or bert_config.hidden_size
    return BiLSTMConfig(size, int(model.head_rnn_layers))


def build_model(task, bert_config: BertConfig, rnn: BiLSTMConfig | None = None) -> nn.Module:
    """The model of ``task.head`` (``bertjax.model.heads``) on ``bert_config``, with the BiLSTM
    ``rnn`` (:func:`head_rnn`) between the encoder and the head when given ('modernbert' task
    models are HF's ``ModernBertFor*``, which have no BiLSTM: a FinetuneInputError)."""
    if rnn is not None and bert_config.is_modern:
        raise FinetuneInputError(
            "config.model.head_rnn='bilstm': the BiLSTM head (the paper's Table 5) is BERT's; "
            "architecture 'modernbert' has HF's prediction heads"
        )
    if task.head in ("classification", "regression"):
        return heads.BertForSequenceClassification(bert_config, task.num_labels, rnn)
    if task.head == "span":
        return heads.BertForQuestionAnswering(bert_config, rnn)
    if task.head == "tagging":
        return heads.BertForTokenClassification(bert_config, task.num_labels, rnn)
    return heads.BertForMultipleChoice(bert_config, rnn)


def model_input_specs(example: dict) -> list[jax.ShapeDtypeStruct]:
    """Shapes of one example's model inputs (batch 1) from feature arrays with leading dim N."""
    return [jax.ShapeDtypeStruct((1, *example[k].shape[1:]), np.int32) for k in MODEL_INPUTS]


def example_weights(batch: dict) -> jax.Array:
    """1 per example, 0 for padding: ``example_weights`` <float32>[B] of unpacked rows, or the
    packed row's ``instance_weights`` <float32>[B, K]."""
    return batch["instance_weights" if "instance_weights" in batch else "example_weights"]


def task_loss(head: str, logits: jax.Array, batch: dict) -> tuple[jax.Array, jax.Array]:
    """(loss sum, weight sum) of one batch; padded examples have weight 0 (``example_weights``)."""
    weights = example_weights(batch)
    if head == "regression":
        return jnp.sum(weights * (logits[..., 0] - batch["label_ids"]) ** 2), jnp.sum(weights)
    if head == "span":
        start = losses.weighted_cross_entropy(logits[..., 0], batch["start_positions"], weights)
        end = losses.weighted_cross_entropy(logits[..., 1], batch["end_positions"], weights)
        return (start["loss_sum"] + end["loss_sum"]) / 2, start["weight_sum"]
    if head == "tagging":
        token_weights = _token_weights(batch)
        sums = losses.weighted_cross_entropy(logits, batch["label_ids"], token_weights)
        return sums["loss_sum"], sums["weight_sum"]
    sums = losses.weighted_cross_entropy(logits, batch["label_ids"], weights)
    return sums["loss_sum"], sums["weight_sum"]


def _token_weights(batch: dict) -> jax.Array:
    """Tagging's weights per token: ``label_weights`` times its example's weight (in a packed row,
    the weight of the slot its ``sequence_ids`` names)."""
    weights = example_weights(batch).astype(jnp.float32)
    if "sequence_ids" in batch:  # [B, K] -> [B, L]: slot 0 is padding, weight 0
        slots = jnp.concatenate([jnp.zeros_like(weights[:, :1]), weights], axis=1)
        return batch["label_weights"] * jnp.take_along_axis(slots, batch["sequence_ids"], axis=1)
    return batch["label_weights"] * weights[:, None]


def _task_weights(head: str, batch: dict) -> jax.Array:
    """What ``task_loss`` counts: examples, or labelled first word pieces for tagging."""
    if head == "tagging":
        return _token_weights(batch)
    return example_weights(batch).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class FineTuning:
    """The ``bertjax.training.step.Objective`` of a task head (hashable: bound into the jit)."""

    model: nn.Module
    head: str
    input_shape: tuple[int, ...]  # one example's input_ids shape: (L,) or (choices, L)
    packed: int = 0  # K of packed rows (bertjax.finetune.packed); 0: one example per row

    @property
    def input_keys(self) -> tuple[str, ...]:
        """The batch features the model reads."""
        return MODEL_INPUTS + (packed_lib.PACKED_INPUTS if self.packed else ())

    def init(self, rng):
        ids = jnp.zeros((1, *self.input_shape), jnp.int32)
        return self.model.init(rng, ids, ids, ids)["params"]

    def normalizers(self, batch) -> dict:
        return {"task": jnp.sum(_task_weights(self.head, batch))}

    def logits(self, params, batch, dropout_rng=None) -> jax.Array:
        """The model's outputs on a batch (dropout with ``dropout_rng``): a packed batch passes
        its sequence ids as the attention mask, its positions and (sentence heads) [CLS]s."""
        packed = {}
        if self.packed:
            packed["positions"] = batch["positions"]
            if self.head != "tagging" or self.model.rnn is not None:  # a BiLSTM's K
                packed["cls_positions"] = batch["cls_positions"]
        mask = batch["sequence_ids" if self.packed else "input_mask"]
        return self.model.apply(
            {"params": params},
            batch["input_ids"],
            batch["segment_ids"],
            mask,
            deterministic=dropout_rng is None,
            rngs=None if dropout_rng is None else {"dropout": dropout_rng},
            **packed,
        )

    def sums(self, params, batch, dropout_rng) -> dict:
        logits = self.logits(params, batch, dropout_rng)
        loss_sum, weight_sum = task_loss(self.head, logits, batch)
        return {"task_loss_sum": loss_sum, "task_weight_sum": weight_sum}

    def loss(self, sums, normalizers):
        return sums["task_loss_sum"] / jnp.maximum(normalizers["task"], 1.0)


def attention_shapes(task, example: dict, packed: int, bert_config, rnn=None) -> self_check.Shapes:
    """The attention calls a step of ``task`` makes on ``example``'s features (what the run's
    kernel is checked at, ``bertjax.training.kernel_check``): L keys; packed rows of K; a packed
    sentence head's last layer queries only the K [CLS] positions when the model gathers it (not
    under a BiLSTM ``rnn``, which reads every position)."""
    gathered = packed and task.head != "tagging" and bert_config.computes_only_output_positions
    gathered = gathered and rnn is None
    length = int(example["input_ids"].shape[-1])
    return self_check.Shapes(length=length, queries=packed if gathered else 0, packed=packed)


def objective_for(task, model: nn.Module, example: dict, mesh: Mesh, packed: int = 0) -> FineTuning:
    """``task``'s objective on ``mesh``: the model's config fitted to the mesh's platform
    (``sharding.bert_config_for``: the attention kernel, the CPU forms); ``example``: feature
    arrays (their shapes fix the inputs'); ``packed``: K of packed rows, or 0."""
    model = model.clone(config=sh.bert_config_for(model.config, mesh))
    return FineTuning(model, task.head, tuple(example["input_ids"].shape[1:]), int(packed))


class Predictor:
    """The model's outputs for every feature of a split, in order, on ``mesh``."""

    def __init__(self, objective: FineTuning, mesh: Mesh, rules, eval_batch_size: int):
        self.objective, self.mesh, self.rules = objective, mesh, sh.normalize_rules(rules)
        self.batch_size = int(eval_batch_size)
        self.param_shardings = compiled.param_shardings(objective, mesh, self.rules)
        self._logits = {}  # input ranks -> the jitted forward
        self._packed = {}  # id(features) -> (features, their packed rows): a split packs once

    def place(self, params):
        """Host (or differently placed) params -> global arrays in the param shardings."""
        return jax.tree.map(
            lambda x, s: x if isinstance(x, jax.Array) and x.sharding == s else sh.put_global(x, s),
            params,
            self.param_shardings,
        )

    def _forward(self, ndim: int) -> compiled.OnMesh:
        if ndim not in self._logits:
            objective = self.objective
            inputs = {k: sh.batch_sharding(self.mesh, ndim) for k in objective.input_keys}
            jitted = jax.jit(
                lambda params, batch: objective.logits(params, batch),
                in_shardings=(self.param_shardings, inputs),
                out_shardings=NamedSharding(self.mesh, PartitionSpec()),
            )
            self._logits[ndim] = compiled.OnMesh(jitted, self.mesh, self.rules)
        return self._logits[ndim]

    def logits(self, params, features) -> np.ndarray:
        """Model outputs for every feature, in order: <float32>[N, ...]. With packing, of the
        split packed (``eval_batch_size`` then counts rows), unpacked to the same layout."""
        if self.objective.packed:
            if id(features) not in self._packed:  # the features are held: the id stays theirs
                rows = packed_lib.pack(features, self.objective.head, self.objective.packed)
                self._packed[id(features)] = (features, rows)
            rows = self._packed[id(features)][1]
            outputs = self._run(params, rows.features)
            return packed_lib.unpack(
                self.objective.head, outputs, rows, self.objective.input_shape[-1]
            )
        return self._run(params, features)

    def _run(self, params, features) -> np.ndarray:
        params = self.place(params)
        ndim = features.arrays["input_ids"].ndim
        forward, sharding = self._forward(ndim), sh.batch_sharding(self.mesh, ndim)
        size, outputs = self.batch_size, []
        for start in range(0, len(features), size):
            rows = {k: features.arrays[k][start : start + size] for k in self.objective.input_keys}
            real = len(next(iter(rows.values())))
            batch = {k: sh.put_global(_pad_rows(v, size), sharding) for k, v in rows.items()}
            outputs.append(np.asarray(forward(params, batch))[:real])
        return np.concatenate(outputs) if outputs else np.zeros((0,), np.float32)


def _pad_rows(x: np.ndarray, size: int) -> np.ndarray:
    if len(x) == size:
        return x
    return np.concatenate([x, np.zeros((size - len(x), *x.shape[1:]), x.dtype)])
