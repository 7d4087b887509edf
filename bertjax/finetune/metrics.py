"""Evaluation metrics of the fine-tuning benchmarks, from their official definitions.

* GLUE: accuracy, F1 of the positive class (MRPC, QQP), Matthews correlation (CoLA), Pearson and
  Spearman correlation (STS-B), as GLUE's reference scorer (scikit-learn / scipy) computes them.
* SQuAD v1.1 / v2.0: exact match and token F1 after the official answer normalisation
  (lower case, no punctuation, no articles ``a|an|the``, single spaces), the maximum over the gold
  answers; for v2.0 the no-answer handling and best-threshold search of ``evaluate-v2.0.py``.
* CoNLL-2003: entity-level precision / recall / F1 exactly as ``conlleval`` counts chunks
  (IOB1 and IOB2 input, ``O`` tag, type changes ending a chunk).

Pure Python / numpy; no JAX.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Sequence

import numpy as np

# ---- GLUE --------------------------------------------------------------------------------------


def accuracy(labels: Sequence[int], predictions: Sequence[int]) -> float:
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    return float(np.mean(labels == predictions)) if labels.size else 0.0


def f1_positive(labels: Sequence[int], predictions: Sequence[int], positive: int = 1) -> float:
    """F1 of the positive class (sklearn's ``f1_score`` default); 0 when it is never predicted."""
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    tp = int(np.sum((predictions == positive) & (labels == positive)))
    fp = int(np.sum((predictions == positive) & (labels != positive)))
    fn = int(np.sum((predictions != positive) & (labels == positive)))
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def matthews_corrcoef(labels: Sequence[int], predictions: Sequence[int]) -> float:
    """Multi-class MCC (sklearn's formula); 0 when a marginal is constant (a constant guess)."""
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    classes = np.union1d(labels, predictions)
    confusion = np.zeros((classes.size, classes.size), np.float64)
    rows, cols = np.searchsorted(classes, labels), np.searchsorted(classes, predictions)
    np.add.at(confusion, (rows, cols), 1)
    t, p = confusion.sum(axis=1), confusion.sum(axis=0)
    c, s = np.trace(confusion), confusion.sum()
    denominator = np.sqrt((s * s - p @ p) * (s * s - t @ t))
    return float((c * s - t @ p) / denominator) if denominator else 0.0


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt((x @ x) * (y @ y))
    return float(x @ y / denominator) if denominator else 0.0


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties get the mean of their ranks (scipy.stats.rankdata 'average')."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    boundaries = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1], True])
    ranks = np.empty(x.size, np.float64)
    for lo, hi in zip(boundaries[:-1], boundaries[1:], strict=True):
        ranks[order[lo:hi]] = (lo + hi + 1) / 2.0
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    return pearson(_average_ranks(x), _average_ranks(y))


# ---- SQuAD -------------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """The official SQuAD normalisation: lower, drop punctuation, drop articles, fix spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def squad_exact(gold: str, prediction: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(prediction))


def squad_f1(gold: str, prediction: str) -> float:
    """Token-overlap F1 after normalisation; an empty side scores 1 only if both are empty."""
    gold_tokens, pred_tokens = normalize_answer(gold).split(), normalize_answer(prediction).split()
    if not gold_tokens or not pred_tokens:
        return float(gold_tokens == pred_tokens)
    common = collections.Counter(gold_tokens) & collections.Counter(pred_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _gold_texts(answers: Sequence[str]) -> list[str]:
    # evaluate-v2.0.py: gold answers that normalise to nothing are dropped; none left = no answer.
    texts = [a for a in answers if normalize_answer(a)]
    return texts or [""]


def squad_scores(gold: dict[str, list[str]], predictions: dict[str, str]):
    """Per-question (exact, f1) dicts, max over gold answers; a missing prediction scores 0."""
    exact, f1 = {}, {}
    for qid, answers in gold.items():
        texts = _gold_texts(answers)
        prediction = predictions.get(qid)
        if prediction is None:
            exact[qid], f1[qid] = 0.0, 0.0
            continue
        exact[qid] = float(max(squad_exact(a, prediction) for a in texts))
        f1[qid] = max(squad_f1(a, prediction) for a in texts)
    return exact, f1


def best_null_threshold(gold, predictions, scores, null_odds) -> tuple[float, float]:
    """evaluate-v2.0.py's ``find_best_thresh``: the best score (%) and the null-odds threshold."""
    has_answer = {qid: bool(answers) for qid, answers in gold.items()}
    score = best = float(sum(not v for v in has_answer.values()))
    threshold = 0.0
    for qid in sorted(null_odds, key=lambda k: null_odds[k]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            score += scores[qid]
        elif predictions.get(qid):
            score -= 1
        if score > best:
            best, threshold = score, null_odds[qid]
    return 100.0 * best / max(len(scores), 1), float(threshold)


def squad_evaluate(
    gold: dict[str, list[str]],
    predictions: dict[str, str],
    null_odds: dict[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, float]:
    """EM / F1 in percent as the official scripts print them (v2.0 keys when ``null_odds``).

    ``gold`` maps a question id to its answer texts (empty list: unanswerable). With ``null_odds``
    this is ``evaluate-v2.0.py --na-prob-file``: a question whose odds exceed ``na_prob_thresh``
    (the script's default 1.0) scores as a no-answer prediction, and ``best_*_thresh`` give the
    ``null_score_diff_threshold`` that maximises each score on this set.
    """
    exact_raw, f1_raw = squad_scores(gold, predictions)
    exact, f1 = dict(exact_raw), dict(f1_raw)
    if null_odds is not None:
        for qid in gold:
            if null_odds.get(qid, 0.0) > na_prob_thresh:
                exact[qid] = f1[qid] = float(not gold[qid])
    total = max(len(gold), 1)
    out = {
        "exact": 100.0 * sum(exact.values()) / total,
        "f1": 100.0 * sum(f1.values()) / total,
        "total": len(gold),
    }
    if null_odds is None:
        return out
    has_answer = {qid: bool(answers) for qid, answers in gold.items()}
    for name, keep in (("HasAns", True), ("NoAns", False)):
        qids = [q for q in gold if has_answer[q] == keep]
        if qids:  # the script merges HasAns_* / NoAns_* only when such questions exist
            out[f"{name}_exact"] = 100.0 * sum(exact[q] for q in qids) / len(qids)
            out[f"{name}_f1"] = 100.0 * sum(f1[q] for q in qids) / len(qids)
            out[f"{name}_total"] = len(qids)
    for name, raw in (("exact", exact_raw), ("f1", f1_raw)):
        best, threshold = best_null_threshold(gold, predictions, raw, null_odds)
        out[f"best_{name}"], out[f"best_{name}_thresh"] = best, threshold
    return out


# ---- CoNLL (conlleval) -------------------------------------------------------------------------


def _split_tag(tag: str) -> tuple[str, str]:
    if tag == "O":
        return "O", ""
    prefix, _, kind = tag.partition("-")
    return prefix, kind


def _end_of_chunk(prev_tag, tag, prev_type, kind) -> bool:
    return (
        prev_tag in ("E", "S")
        or (prev_tag == "B" and tag in ("B", "S", "O"))
        or (prev_tag == "I" and tag in ("B", "S", "O"))
        or (prev_tag not in ("O", ".") and prev_type != kind)
    )


def _start_of_chunk(prev_tag, tag, prev_type, kind) -> bool:
    return (
        tag in ("B", "S")
        or (prev_tag in ("E", "S", "O") and tag in ("E", "I"))
        or (tag not in ("O", ".") and prev_type != kind)
    )


def conlleval(
    gold_sentences: Sequence[Sequence[str]], predicted_sentences: Sequence[Sequence[str]]
) -> dict[str, float]:
    """Entity-level precision / recall / F1 (percent) and token accuracy, as ``conlleval``.

    Sentences are lists of tags (``O``, ``B-PER``, ``I-LOC``, ...); a sentence boundary ends every
    chunk, like the blank line in conlleval's input.
    """
    correct_chunks = found_gold = found_guessed = correct_tags = tokens = 0
    for gold_tags, guessed_tags in zip(gold_sentences, predicted_sentences, strict=True):
        if len(gold_tags) != len(guessed_tags):
            raise ValueError(
                f"conlleval: a sentence has {len(gold_tags)} gold tags but "
                f"{len(guessed_tags)} predicted tags"
            )
        in_correct, last_gold, last_guessed = False, ("O", ""), ("O", "")
        for gold_tag, guessed_tag in [*zip(gold_tags, guessed_tags, strict=True), ("O", "O")]:
            gold, guessed = _split_tag(gold_tag), _split_tag(guessed_tag)
            end_gold = _end_of_chunk(last_gold[0], gold[0], last_gold[1], gold[1])
            end_guessed = _end_of_chunk(last_guessed[0], guessed[0], last_guessed[1], guessed[1])
            start_gold = _start_of_chunk(last_gold[0], gold[0], last_gold[1], gold[1])
            start_guessed = _start_of_chunk(
                last_guessed[0], guessed[0], last_guessed[1], guessed[1]
            )
            if in_correct:
                if end_gold and end_guessed and last_guessed[1] == last_gold[1]:
                    in_correct = False
                    correct_chunks += 1
                elif end_gold != end_guessed or guessed[1] != gold[1]:
                    in_correct = False
            if start_gold and start_guessed and guessed[1] == gold[1]:
                in_correct = True
            found_gold += start_gold
            found_guessed += start_guessed
            last_gold, last_guessed = gold, guessed
        correct_tags += sum(g == p for g, p in zip(gold_tags, guessed_tags, strict=True))
        tokens += len(gold_tags)
    precision = 100.0 * correct_chunks / found_guessed if found_guessed else 0.0
    recall = 100.0 * correct_chunks / found_gold if found_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "accuracy": 100.0 * correct_tags / tokens if tokens else 0.0,
        "found_gold": found_gold,
        "found_guessed": found_guessed,
        "correct": correct_chunks,
    }
