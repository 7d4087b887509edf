"""SQuAD decoding: start/end logits of every window -> answer text, n-best list and null odds.

Follows the original ``write_predictions``: per example, the ``n_best_size`` best start and end
positions of each window give candidate spans (end >= start, length <= ``max_answer_length``,
both inside the passage, start with maximal context in its window); candidates are ranked by
start + end logit; the WordPieces are mapped back to the original whitespace words and the text
is trimmed to the predicted pieces (``final_text``). For v2.0 the null score is the smallest
[CLS] start + end logit over the windows; the null odds are null score - best span score, and
the prediction is "" when they exceed the threshold (``threshold_predictions``).
"""

from __future__ import annotations

import collections
import unicodedata

import numpy as np


def _strip_spaces(text: str) -> tuple[str, dict[int, int]]:
    chars, index_map = [], {}
    for i, ch in enumerate(text):
        if ch != " ":
            index_map[len(chars)] = i
            chars.append(ch)
    return "".join(chars), index_map


def final_text(pred_text: str, orig_text: str, do_lower_case: bool) -> str:
    """The part of ``orig_text`` (original words) that the normalised ``pred_text`` covers.

    When the two cannot be aligned character by character, ``orig_text`` is returned (as the
    original ``get_final_text``).
    """
    tok_text = " ".join(basic_tokens(orig_text, do_lower_case))
    start = tok_text.find(pred_text)
    if start == -1:
        return orig_text
    end = start + len(pred_text) - 1
    orig_ns, orig_map = _strip_spaces(orig_text)
    tok_ns, tok_map = _strip_spaces(tok_text)
    if len(orig_ns) != len(tok_ns):
        return orig_text
    tok_to_ns = {v: k for k, v in tok_map.items()}
    if start not in tok_to_ns or end not in tok_to_ns:
        return orig_text
    return orig_text[orig_map[tok_to_ns[start]] : orig_map[tok_to_ns[end]] + 1]


def _top(values: np.ndarray, n: int) -> list[int]:
    return [int(i) for i in np.argsort(-values, kind="stable")[:n]]


def _candidates(feature_ids, features, logits, config):
    """(feature id, start, end, start logit, end logit) spans and the null (score, entry)."""
    prelim, null = [], None
    for f in feature_ids:
        meta = features.meta[f]
        start_logits, end_logits = logits[f, :, 0], logits[f, :, 1]
        null_score = start_logits[0] + end_logits[0]
        if null is None or null_score < null[0]:
            null = (float(null_score), (f, 0, 0, float(start_logits[0]), float(end_logits[0])))
        to_orig, is_max = meta["token_to_orig_map"], meta["token_is_max_context"]
        for s in _top(start_logits, config.task.n_best_size):
            for e in _top(end_logits, config.task.n_best_size):
                if s not in to_orig or e not in to_orig or not is_max.get(s, False):
                    continue
                if e < s or e - s + 1 > config.task.max_answer_length:
                    continue
                prelim.append((f, s, e, float(start_logits[s]), float(end_logits[e])))
    return prelim, null


def _span_text(example, features, tokenizer, f, s, e) -> str:
    meta = features.meta[f]
    pieces = tokenizer.convert_ids_to_tokens(meta["token_ids"][s : e + 1])
    tok_text = " ".join(pieces).replace(" ##", "").replace("##", "")
    tok_text = " ".join(tok_text.strip().split())
    words = example.doc_tokens[meta["token_to_orig_map"][s] : meta["token_to_orig_map"][e] + 1]
    return final_text(tok_text, " ".join(words), tokenizer.do_lower_case)


def decode(examples, features, logits, tokenizer, config, is_v2: bool):
    """-> (predictions {id: text}, null_odds {id: float} (v2.0), nbest {id: [entries]})."""
    by_example = collections.defaultdict(list)
    for f, meta in enumerate(features.meta):
        by_example[meta["example_index"]].append(f)
    predictions, null_odds, nbest_json = {}, {}, {}
    for index, example in enumerate(examples):
        prelim, null = _candidates(by_example[index], features, logits, config)
        if is_v2 and null is not None:
            prelim.append(null[1])
        prelim.sort(key=lambda c: c[3] + c[4], reverse=True)
        nbest, seen = [], set()
        for f, s, e, start_logit, end_logit in prelim:
            if len(nbest) >= config.task.n_best_size:
                break
            text = _span_text(example, features, tokenizer, f, s, e) if s > 0 else ""
            if text in seen:
                continue
            seen.add(text)
            nbest.append((text, start_logit, end_logit))
        if is_v2 and "" not in seen and null is not None:
            nbest.append(("", null[1][3], null[1][4]))
        if len(nbest) < (2 if is_v2 else 1):  # the original's guard against an empty list
            nbest.insert(0, ("empty", 0.0, 0.0))
        scores = np.asarray([s + e for _, s, e in nbest])
        probs = np.exp(scores - scores.max())
        probs /= probs.sum()
        nbest_json[example.qas_id] = [
            {"text": t, "probability": float(p), "start_logit": s, "end_logit": e}
            for (t, s, e), p in zip(nbest, probs, strict=True)
        ]
        if not is_v2:
            predictions[example.qas_id] = nbest[0][0]
            continue
        best = next(entry for entry in nbest if entry[0])
        null_odds[example.qas_id] = float(null[0] - best[1] - best[2])
    if is_v2:
        predictions = threshold_predictions(
            nbest_json, null_odds, float(config.task.null_score_diff_threshold)
        )
    return predictions, null_odds, nbest_json


def threshold_predictions(nbest_json: dict, null_odds: dict, threshold: float) -> dict[str, str]:
    """The v2.0 answers at ``threshold``: "" when null odds > threshold, else the best non-null
    n-best text. The same as decoding again with ``null_score_diff_threshold=threshold`` (what
    the original README does with the ``best_f1_thresh`` that evaluate-v2.0.py prints)."""
    return {
        qid: "" if odds > threshold else next(e["text"] for e in nbest_json[qid] if e["text"])
        for qid, odds in null_odds.items()
    }


def basic_tokens(text: str, do_lower_case: bool) -> list[str]:
    """BERT's basic tokenization (lower + strip accents, split punctuation) for answer alignment."""
    out = []
    for word in text.split():
        if do_lower_case:
            word = "".join(
                c
                for c in unicodedata.normalize("NFD", word.lower())
                if unicodedata.category(c) != "Mn"
            )
        current = ""
        for ch in word:
            if _is_punctuation(ch):
                out += [current, ch] if current else [ch]
                current = ""
            else:
                current += ch
        if current:
            out.append(current)
    return out


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")
