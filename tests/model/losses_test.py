"""Pretraining losses vs PyTorch's cross entropy (HF BertForPreTraining's loss definition)."""

import jax.numpy as jnp
import numpy as np
import torch

from bertjax.model import losses


def _batch(rng, batch=4, predictions=6, vocab=11):
    weights = (rng.random((batch, predictions)) < 0.7).astype(np.float32)
    weights[0] = 0.0  # a row without predictions
    return {
        "masked_lm_ids": rng.integers(0, vocab, (batch, predictions)).astype(np.int32),
        "masked_lm_weights": weights,
        "next_sentence_labels": rng.integers(0, 2, (batch,)).astype(np.int32),
    }


def test_sums_match_torch_cross_entropy_over_real_positions():
    rng = np.random.default_rng(0)
    batch = _batch(rng)
    mlm_logits = rng.normal(size=(4, 6, 11)).astype(np.float32) * 3
    nsp_logits = rng.normal(size=(4, 2)).astype(np.float32)
    sums = losses.pretraining_sums(jnp.asarray(mlm_logits), jnp.asarray(nsp_logits), batch)
    real = batch["masked_lm_weights"] > 0
    # HF: labels -100 at non-masked positions, CrossEntropyLoss(mean) over the rest.
    mlm_ref = torch.nn.functional.cross_entropy(
        torch.from_numpy(mlm_logits[real]), torch.from_numpy(batch["masked_lm_ids"][real]).long()
    ).item()
    nsp_ref = torch.nn.functional.cross_entropy(
        torch.from_numpy(nsp_logits), torch.from_numpy(batch["next_sentence_labels"]).long()
    ).item()
    np.testing.assert_allclose(sums["mlm_loss_sum"] / sums["mlm_weight_sum"], mlm_ref, rtol=1e-5)
    np.testing.assert_allclose(sums["nsp_loss_sum"] / sums["nsp_weight_sum"], nsp_ref, rtol=1e-5)
    total = losses.total_loss(sums, sums["mlm_weight_sum"], sums["nsp_weight_sum"], 1.0)
    np.testing.assert_allclose(total, mlm_ref + nsp_ref, rtol=1e-5)
    # MLPerf's masked-LM accuracy: correct predictions over weighted masked positions.
    correct = (mlm_logits.argmax(-1) == batch["masked_lm_ids"])[real].sum()
    assert float(sums["mlm_correct_sum"]) == correct
    assert float(sums["mlm_weight_sum"]) == real.sum()


def test_padding_rows_of_eval_batches_do_not_count():
    rng = np.random.default_rng(1)
    batch = _batch(rng)
    batch["example_weight"] = np.array([1, 1, 0, 0], np.float32)
    sums = losses.pretraining_sums(jnp.zeros((4, 6, 11)), jnp.zeros((4, 2)), batch)
    assert float(sums["nsp_weight_sum"]) == 2.0
    np.testing.assert_allclose(float(sums["nsp_loss_sum"]), 2 * np.log(2), rtol=1e-6)


def test_no_masked_positions_gives_zero_not_nan():
    batch = _batch(np.random.default_rng(2))
    batch["masked_lm_weights"][:] = 0.0
    sums = losses.pretraining_sums(jnp.zeros((4, 6, 11)), jnp.zeros((4, 2)), batch)
    total = losses.total_loss(sums, sums["mlm_weight_sum"], sums["nsp_weight_sum"], 0.0)
    assert float(total) == 0.0
