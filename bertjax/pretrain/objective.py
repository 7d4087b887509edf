"""Pretraining's objective on the trainer core: MLM + NSP on ``BertForPreTraining``.

The loss is the paper's: mean MLM loss over the masked positions of the global batch plus
``train.nsp_loss_weight`` x mean NSP loss over its instances (a packed row counts each of its
instances; ``bertjax.model.losses``); the denominators are counted over the whole global batch
before it is split into micro-batches, so gradient accumulation gives the same update. The batch
is the spec of ``bertjax.data.pipeline`` (``BATCH_KEYS``; packed rows add their features),
split over the mesh's data axes; eval batches also carry ``example_weight``.

Everything else (state, shardings, the pure step, jit, accumulation, the non-finite guard) is the
trainer core's: ``bertjax.training.step`` and ``bertjax.training.compiled``. :func:`build_trainer`
is what ``bertjax.main`` runs and ``python -m bertjax.compile`` lowers.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.sharding import Mesh

from bertjax.data import pipeline
from bertjax.model import losses
from bertjax.model.attention import self_check
from bertjax.model.config import BertConfig
from bertjax.model.heads import BertForPreTraining
from bertjax.training import batch_schedule, compiled, metrics, optimizer
from bertjax.training import sharding as sh
from bertjax.training.batch_schedule import BatchSchedule
from bertjax.training.step import StepConfig

# The batch contract's keys (the pipeline module imports neither TensorFlow nor JAX on import).
BATCH_KEYS = pipeline.STEP_FEATURES
# What a packed row adds (the packed-row contract; next_sentence_labels becomes [B, K]).
PACKED_KEYS = pipeline.PACKED_FEATURES


def pack_width(config) -> int:
    """K, the instances a packed row holds (``data.max_sequences_per_pack``), or 0 unpacked."""
    data = config.data
    return int(data.max_sequences_per_pack) if data.pack_sequences else 0


# The objective's metrics in the console line, in order, with their names there (a run without
# NSP, ``train.nsp_loss_weight`` 0, shows and records the first two only: :func:`has_nsp`).
SHORT_NAMES = (
    ("mlm_loss", "mlm_loss"),
    ("mlm_accuracy", "mlm_acc"),
    ("nsp_loss", "nsp_loss"),
    ("nsp_accuracy", "nsp_acc"),
)


def has_nsp(config) -> bool:
    """Whether the run trains NSP (No NSP, LTR and ModernBERT set its loss weight to 0: their
    NSP head is untrained and its accuracy means nothing)."""
    return float(config.train.nsp_loss_weight) > 0


@dataclasses.dataclass(frozen=True)
class Pretraining:
    """The ``bertjax.training.step.Objective`` of MLM + NSP (hashable: bound into the jit)."""

    model: nn.Module
    length: int
    predictions: int
    nsp_loss_weight: float = 1.0

    def init(self, rng):
        ids = jnp.zeros((1, self.length), jnp.int32)
        positions = jnp.zeros((1, self.predictions), jnp.int32)
        return self.model.init({"params": rng}, ids, ids, ids, positions)["params"]

    def normalizers(self, batch) -> dict:
        return {
            "mlm": jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)),
            "nsp": jnp.sum(losses.instance_weights(batch)),
        }

    def sums(self, params, batch, dropout_rng) -> dict:
        out = self.model.apply(
            {"params": params},
            batch["input_ids"],
            batch["segment_ids"],
            batch.get("sequence_ids", batch["input_mask"]),  # packed rows: the instances
            batch["masked_lm_positions"],
            deterministic=dropout_rng is None,
            rngs=None if dropout_rng is None else {"dropout": dropout_rng},
            positions=batch.get("positions"),
            cls_positions=batch.get("cls_positions"),
        )
        return losses.pretraining_sums(out.mlm_logits, out.nsp_logits, batch)

    def loss(self, sums, normalizers):
        return losses.total_loss(sums, normalizers["mlm"], normalizers["nsp"], self.nsp_loss_weight)


def summarize(sums: dict, nsp: bool = True) -> dict:
    """Window (or eval) sums -> mean MLM (and with ``nsp``, NSP) loss and accuracy (MLM accuracy
    is MLPerf's: correct masked predictions / weighted masked positions)."""
    values = {
        "mlm_loss": metrics.ratio(sums["mlm_loss_sum"], sums["mlm_weight_sum"]),
        "mlm_accuracy": metrics.ratio(sums["mlm_correct_sum"], sums["mlm_weight_sum"]),
    }
    if nsp:
        values["nsp_loss"] = metrics.ratio(sums["nsp_loss_sum"], sums["nsp_weight_sum"])
        values["nsp_accuracy"] = metrics.ratio(sums["nsp_correct_sum"], sums["nsp_weight_sum"])
    return values


def summarize_eval(sums: dict, nsp: bool = True) -> dict:
    return {**summarize(sums, nsp), "sequences": sums["nsp_weight_sum"]}


def bert_config_from(config) -> BertConfig:
    """``config.model`` as a BertConfig (ValueError naming the field when it cannot work)."""
    return BertConfig.from_dict(config.model.to_dict(), source="config.model")


def step_config_from(config) -> StepConfig:
    return StepConfig(int(config.train.grad_accum_steps), bool(config.train.skip_nonfinite))


def schedule_steps(config, schedule: BatchSchedule | None = None) -> int:
    """The learning-rate schedule's length: ``optimizer.decay_steps``, else the run's
    ``train.num_steps`` in full-batch steps (``schedule``: a batch-size warm-up's)."""
    if int(config.optimizer.decay_steps):
        return int(config.optimizer.decay_steps)
    steps = int(config.train.num_steps)
    return steps if schedule is None else round(schedule.rows_before(steps) / schedule.full)


def objective_from(config, bert_config: BertConfig) -> Pretraining:
    return Pretraining(
        BertForPreTraining(bert_config),
        int(config.data.max_seq_length),
        int(config.data.max_predictions_per_seq),
        float(config.train.nsp_loss_weight),
    )


def abstract_batch(
    global_batch: int, length: int, predictions: int, eval: bool = False, pack: int = 0
) -> dict:
    """The global batch spec; eval batches also carry ``example_weight <float32>[B]``; ``pack``
    = K > 0: packed rows of up to K instances (the packed row's features)."""
    i32, f32 = jnp.int32, jnp.float32
    spec = {k: ((global_batch, length), i32) for k in BATCH_KEYS[:3]}
    spec.update(
        masked_lm_positions=((global_batch, predictions), i32),
        masked_lm_ids=((global_batch, predictions), i32),
        masked_lm_weights=((global_batch, predictions), f32),
        next_sentence_labels=((global_batch,), i32),
    )
    if pack:
        spec.update(
            positions=((global_batch, length), i32),
            sequence_ids=((global_batch, length), i32),
            cls_positions=((global_batch, pack), i32),
            next_sentence_labels=((global_batch, pack), i32),
            instance_weights=((global_batch, pack), f32),
        )
    if eval:
        spec["example_weight"] = ((global_batch,), f32)
    return {k: jax.ShapeDtypeStruct(*v) for k, v in spec.items()}


@dataclasses.dataclass(frozen=True)
class Steps:
    """What ``bertjax.main`` compiles for a config on a mesh, built without allocating."""

    bert_config: BertConfig
    trainer: compiled.Trainer
    eval_step: compiled.OnMesh
    eval_batch: dict  # the abstract global eval batch


def attention_shapes(config, bert_config: BertConfig) -> self_check.Shapes:
    """The attention calls a step of ``config`` makes (what the run's kernel is checked at,
    ``bertjax.training.kernel_check``): L keys; with the gathered last layer, K [CLS] positions
    (1 unpacked) + P masked positions as its queries; packed rows of K."""
    length, pack = int(config.data.max_seq_length), pack_width(config)
    gathered = max(pack, 1) + int(config.data.max_predictions_per_seq)
    queries = gathered if bert_config.computes_only_output_positions else 0
    return self_check.Shapes(length=length, queries=queries, packed=pack)


def build_steps(
    config, mesh: Mesh, bert_config: BertConfig | None = None, batches: BatchSchedule | None = None
) -> Steps:
    """The trainer (abstract state, shardings, train step) and the eval step, jitted once for
    ``config``'s global batch shapes on ``mesh``, of ``bert_config`` (default: the config's
    model; the run passes the one its kernel check decided), with the learning rate counting
    ``batches``' full-batch steps (default: the schedule ``config`` gives on ``mesh``; the run
    passes the one it reads its data by). Nothing is allocated."""
    bert_config = sh.bert_config_for(bert_config or bert_config_from(config), mesh)
    length, predictions = int(config.data.max_seq_length), int(config.data.max_predictions_per_seq)
    objective = objective_from(config, bert_config)
    if batches is None:  # the run's batch schedule, as bertjax.pretrain.loop derives it
        batches = batch_schedule.on_mesh(config, mesh, jax.process_count())
    steps, step_map = schedule_steps(config, batches), batches.full_batch_steps
    tx = optimizer.create_optimizer(config.optimizer, steps, step_map)
    schedule = optimizer.learning_rate_schedule(config.optimizer, steps, step_map)
    pack = pack_width(config)
    train_rows, eval_rows = int(config.train.global_batch_size), int(config.train.eval_batch_size)
    train_batch = abstract_batch(train_rows, length, predictions, pack=pack)
    eval_batch = abstract_batch(eval_rows, length, predictions, eval=True, pack=pack)
    trainer = compiled.build_trainer(
        objective, tx, schedule, step_config_from(config), mesh, config.mesh.rules, train_batch
    )
    return Steps(bert_config, trainer, trainer.jit_eval(eval_batch), eval_batch)
