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


# ---- evaluate-v2.0.py, transcribed (main with --na-prob-file, default --na-prob-thresh 1.0) ----


def official_v2(dataset, preds, na_probs, na_prob_thresh=1.0):
    has_ans = {
        qa["id"]: bool(qa["answers"])
        for article in dataset
        for p in article["paragraphs"]
        for qa in p["qas"]
    }
    exact_raw, f1_raw = {}, {}
    for article in dataset:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                golds = [a["text"] for a in qa["answers"] if M.normalize_answer(a["text"])]
                golds = golds or [""]
                if qa["id"] not in preds:
                    continue
                exact_raw[qa["id"]] = max(M.squad_exact(a, preds[qa["id"]]) for a in golds)
                f1_raw[qa["id"]] = max(M.squad_f1(a, preds[qa["id"]]) for a in golds)

    def apply(scores):
        return {
            q: float(not has_ans[q]) if na_probs[q] > na_prob_thresh else s
            for q, s in scores.items()
        }

    def make(exact, f1, qids=None):
        qids = qids or list(exact)
        total = len(qids)
        return {
            "exact": 100.0 * sum(exact[k] for k in qids) / total,
            "f1": 100.0 * sum(f1[k] for k in qids) / total,
            "total": total,
        }

    def best(scores):
        cur = best_score = sum(1 for k in has_ans if not has_ans[k])
        best_thresh = 0.0
        for qid in sorted(na_probs, key=lambda k: na_probs[k]):
            if qid not in scores:
                continue
            diff = scores[qid] if has_ans[qid] else (-1 if preds[qid] else 0)
            cur += diff
            if cur > best_score:
                best_score, best_thresh = cur, na_probs[qid]
        return 100.0 * best_score / len(scores), best_thresh

    exact, f1 = apply(exact_raw), apply(f1_raw)
    out = make(exact, f1)
    for prefix, keep in (("HasAns", True), ("NoAns", False)):
        qids = [k for k, v in has_ans.items() if v == keep]
        if qids:
            out.update({f"{prefix}_{k}": v for k, v in make(exact, f1, qids).items()})
    out["best_exact"], out["best_exact_thresh"] = best(exact_raw)
    out["best_f1"], out["best_f1_thresh"] = best(f1_raw)
    return out


def _dataset(gold):
    qas = [{"id": q, "answers": [{"text": t} for t in answers]} for q, answers in gold.items()]
    return [{"paragraphs": [{"qas": qas}]}]


def _check_v2(gold, predictions, null_odds):
    expected = official_v2(_dataset(gold), predictions, null_odds)
    got = M.squad_evaluate(gold, predictions, null_odds)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-9), key


def test_squad_v2_best_threshold_vs_official_hand_made():
    # Ties in the odds, partial F1, a gold answer that normalises to nothing ("The" -> no answer
    # text but has_ans True), odds above the 1.0 na-prob threshold, a best threshold at -2.5.
    gold = {
        "a": ["Denver Broncos", "Broncos"],
        "b": [],
        "c": ["Paris"],
        "d": [],
        "e": ["The"],
        "f": ["the big red fox"],
    }
    predictions = {"a": "the Broncos", "b": "", "c": "Paris", "d": "Lyon", "e": "a", "f": "fox"}
    null_odds = {"a": -4.0, "b": 3.0, "c": -2.5, "d": -2.5, "e": 1.5, "f": 0.0}
    _check_v2(gold, predictions, null_odds)
    # Every prediction empty (run_squad's output when all odds exceed the threshold): no gain.
    _check_v2(gold, {q: "" for q in gold}, null_odds)
    # Only answerable questions / only unanswerable ones.
    _check_v2({"a": ["x"], "c": ["y z"]}, {"a": "x", "c": "z"}, {"a": 0.3, "c": -0.2})
    _check_v2({"b": [], "d": []}, {"b": "x", "d": ""}, {"b": -1.0, "d": 2.0})


def test_squad_v2_best_threshold_vs_official_random():
    rng = np.random.default_rng(0)
    words = ["red", "fox", "the", "big", "dog", "a"]
    for _ in range(20):
        gold, predictions, null_odds = {}, {}, {}
        for i in range(int(rng.integers(3, 25))):
            qid = f"q{i}"
            gold[qid] = [
                " ".join(rng.choice(words, size=int(rng.integers(1, 4))))
                for _ in range(int(rng.integers(0, 3)))
            ]
            predictions[qid] = " ".join(rng.choice(words, size=int(rng.integers(0, 4))))
            null_odds[qid] = float(rng.choice([-3.0, -1.0, -0.5, 0.0, 0.5, 2.0]))  # ties
        _check_v2(gold, predictions, null_odds)
