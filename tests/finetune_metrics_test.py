"""Metrics vs their official definitions on hand-made cases (and scipy for the correlations)."""

import math

import numpy as np
import pytest

from bertjax.finetune import metrics as M


def test_squad_normalization_articles_punctuation_whitespace():
    assert M.normalize_answer("The  Cat, sat!") == "cat sat"
    assert M.normalize_answer("an apple a day") == "apple day"
    assert M.normalize_answer("theatre") == "theatre"  # 'the' only as a whole word
    assert M.normalize_answer("A-B") == "ab"  # punctuation is deleted, not replaced by a space


def test_squad_scores_multiple_gold_answers():
    # F1 is the max over gold answers: 'Denver Broncos' vs prediction 'the Broncos' -> 2/3.
    assert M.squad_f1("Denver Broncos", "the Broncos") == pytest.approx(2 / 3)
    gold = {"q1": ["Denver Broncos", "Broncos"], "q2": ["Paris"]}
    result = M.squad_evaluate(gold, {"q1": "the Broncos", "q2": "London"})
    assert result["exact"] == pytest.approx(50.0)
    assert result["f1"] == pytest.approx(50.0)
    # A missing prediction scores 0 (evaluate-v1.1.py: "Unanswered question ... score 0").
    assert M.squad_evaluate(gold, {"q1": "Broncos"})["exact"] == pytest.approx(50.0)


def test_squad_v2_no_answer_and_best_threshold():
    gold = {"a": ["Rollo"], "b": [], "c": ["Paris"]}
    predictions = {"a": "Rollo", "b": "Normandy", "c": ""}
    null_odds = {"a": -3.0, "b": 0.5, "c": -1.0}
    result = M.squad_evaluate(gold, predictions, null_odds)
    # raw: a=1, b=0 (predicted text for an unanswerable), c=0 (predicted "" for an answerable)
    assert result["exact"] == pytest.approx(100 / 3)
    assert result["HasAns_total"] == 2 and result["NoAns_total"] == 1
    assert result["HasAns_exact"] == pytest.approx(50.0) and result["NoAns_exact"] == 0.0
    # find_best_thresh by hand: start at #no-answer = 1; sorted odds a(-3): +1 -> 2 (best, thr -3);
    # c(-1): +0 -> 2; b(0.5): predicted text -> -1 -> 1. Best 2/3 at threshold -3.
    assert result["best_exact"] == pytest.approx(200 / 3)
    assert result["best_exact_thresh"] == -3.0
    # An odds value above the script's na_prob_thresh (1.0) turns the prediction into "no answer".
    result = M.squad_evaluate(gold, predictions, {"a": -3.0, "b": 2.0, "c": -1.0})
    assert result["exact"] == pytest.approx(200 / 3)


def test_conlleval_iob2_boundaries_and_types():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG"]]
    r = M.conlleval(gold, pred)
    assert (r["correct"], r["found_gold"], r["found_guessed"]) == (2, 3, 3)
    assert r["precision"] == pytest.approx(200 / 3) and r["f1"] == pytest.approx(200 / 3)
    # A prediction that stops early is not a correct chunk.
    r = M.conlleval([["B-PER", "I-PER"]], [["B-PER", "O"]])
    assert (r["correct"], r["found_gold"], r["found_guessed"]) == (0, 1, 1)
    # An I- tag after O starts a chunk (conlleval is lenient), and the O tag is never a chunk.
    r = M.conlleval([["O", "B-PER", "I-PER"]], [["O", "I-PER", "I-PER"]])
    assert (r["correct"], r["found_gold"], r["found_guessed"]) == (1, 1, 1)
    assert r["accuracy"] == pytest.approx(200 / 3)


def test_conlleval_iob1():
    # IOB1: B- only separates two adjacent chunks of the same type; a type change ends a chunk.
    gold = [["I-PER", "I-PER", "B-PER", "I-LOC", "O", "I-MISC"]]
    r = M.conlleval(gold, gold)
    assert (r["correct"], r["found_gold"]) == (4, 4) and r["f1"] == 100.0
    r = M.conlleval(gold, [["I-PER", "I-PER", "I-PER", "I-LOC", "O", "I-MISC"]])
    assert (r["correct"], r["found_gold"], r["found_guessed"]) == (2, 4, 3)
    # A sentence boundary ends a chunk even when the tags continue.
    r = M.conlleval([["I-PER"], ["I-PER"]], [["I-PER"], ["I-PER"]])
    assert (r["correct"], r["found_gold"]) == (2, 2)


def test_mcc_constant_predictor_and_reference_formula():
    labels = [0, 1, 1, 0, 1, 1, 0, 1]
    assert M.matthews_corrcoef(labels, [1] * 8) == 0.0
    assert M.matthews_corrcoef(labels, labels) == pytest.approx(1.0)
    assert M.matthews_corrcoef(labels, [1 - x for x in labels]) == pytest.approx(-1.0)
    predictions = [0, 1, 0, 0, 1, 1, 1, 1]
    tp, tn, fp, fn = 4, 2, 1, 1
    expected = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert M.matthews_corrcoef(labels, predictions) == pytest.approx(expected)


def test_f1_and_accuracy_for_mrpc_qqp():
    labels, predictions = [1, 1, 0, 0, 1], [1, 0, 1, 0, 1]
    assert M.f1_positive(labels, predictions) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    assert M.accuracy(labels, predictions) == pytest.approx(0.6)
    assert M.f1_positive([0, 0], [0, 0]) == 0.0


def test_pearson_spearman_vs_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    x = rng.normal(size=50)
    y = x + rng.normal(size=50)
    y_ties = np.round(y)  # ties exercise the average ranks
    assert M.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
    assert M.spearman(x, y_ties) == pytest.approx(stats.spearmanr(x, y_ties)[0], abs=1e-12)
