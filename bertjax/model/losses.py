"""Pretraining losses as pure functions returning *sums* and *weights*.

Sums (not means) let the train step accumulate micro-batches and shards exactly: the loss the
optimizer sees is ``mlm_loss_sum / mlm_weight + nsp_weight_factor * nsp_loss_sum / nsp_count``,
i.e. the paper's mean MLM loss over masked positions plus mean NSP loss over sequences, with the
denominators taken over the whole global batch. Metrics are divided on the host.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def weighted_cross_entropy(logits: jax.Array, labels: jax.Array, weights: jax.Array):
    """Softmax cross entropy and accuracy, summed with weights.

    Args:
      logits: <float32>[..., C].
      labels: <int32>[...] class ids.
      weights: <float32>[...] (0 for padding predictions).

    Returns:
      dict of scalars: ``loss_sum`` = sum(w * -log p[label]), ``correct_sum`` = sum(w * [the
      label's logit is a maximum]), ``weight_sum`` = sum(w).
    """
    logits = logits.astype(jnp.float32)
    weights = weights.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    label_logit = jnp.take_along_axis(logits, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
    nll = log_z - label_logit
    # label_logit >= max equals argmax == label except on exact ties (counted correct here), and
    # avoids XLA:CPU's slow variadic (value, index) reduce over [B, P, V].
    correct = (label_logit >= jnp.max(logits, axis=-1)).astype(jnp.float32)
    return {
        "loss_sum": jnp.sum(nll * weights),
        "correct_sum": jnp.sum(correct * weights),
        "weight_sum": jnp.sum(weights),
    }


def pretraining_sums(mlm_logits, nsp_logits, batch) -> dict[str, jax.Array]:
    """MLM + NSP sums for one (micro-)batch.

    Args:
      mlm_logits: <float32>[B, P, V] at ``batch['masked_lm_positions']``.
      nsp_logits: <float32>[B, 2], or [B, K, 2] for a packed batch (one per instance).
      batch: the pretraining batch dict (``masked_lm_ids <int32>[B, P]``, ``masked_lm_weights
        <float32>[B, P]``, ``next_sentence_labels <int32>[B]`` or [B, K] with
        ``instance_weights <float32>[B, K]`` when packed; optional ``example_weight
        <float32>[B]`` that zeroes padding rows of an eval batch).

    Returns:
      ``mlm_loss_sum, mlm_correct_sum, mlm_weight_sum, nsp_loss_sum, nsp_correct_sum,
      nsp_weight_sum`` (float32 scalars; NSP's weight is the count of real instances).
    """
    mlm = weighted_cross_entropy(mlm_logits, batch["masked_lm_ids"], batch["masked_lm_weights"])
    labels = batch["next_sentence_labels"].reshape(-1)
    nsp_weights = instance_weights(batch)
    nsp = weighted_cross_entropy(nsp_logits.reshape(-1, 2), labels, nsp_weights)
    out = {f"mlm_{k}": v for k, v in mlm.items()}
    out.update({f"nsp_{k}": v for k, v in nsp.items()})
    return out


def instance_weights(batch) -> jax.Array:
    """<float32>[B] (or [B * K] for a packed batch): 1 per real instance, 0 for a packed row's
    empty slots (``instance_weights``) and for padding rows of a finite eval stream."""
    labels = batch["next_sentence_labels"]
    weights = jnp.ones(labels.shape, jnp.float32)
    if "instance_weights" in batch:
        weights = batch["instance_weights"].astype(jnp.float32)
    if "example_weight" in batch:
        row = batch["example_weight"].astype(jnp.float32)
        weights = weights * row.reshape(row.shape + (1,) * (weights.ndim - 1))
    return weights.reshape(-1)


def total_loss(sums, mlm_denominator, nsp_denominator, nsp_loss_weight: float) -> jax.Array:
    """Mean MLM loss + ``nsp_loss_weight`` x mean NSP loss, with given (global) denominators.

    Denominators are clamped to 1 so a batch with no masked positions gives loss 0, not NaN.
    """
    mlm = sums["mlm_loss_sum"] / jnp.maximum(mlm_denominator, 1.0)
    nsp = sums["nsp_loss_sum"] / jnp.maximum(nsp_denominator, 1.0)
    return mlm + nsp_loss_weight * nsp
