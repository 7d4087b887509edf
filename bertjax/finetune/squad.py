"""SQuAD v1.1 / v2.0 (paper §4.2, §4.3): reader, doc-stride features, n-best decoding, outputs.

Files in ``config.task.data_dir``: ``train-v1.1.json``, ``dev-v1.1.json`` (``-v2.0`` for v2.0) and,
for predict mode, ``test-v1.1.json`` (same JSON, answers not needed). As the original
``run_squad.py``: the passage is split on whitespace, each word into WordPieces (orig -> sub-token
maps); the question (at most ``max_query_length`` pieces) is segment A and a window of the passage
segment B; windows advance by ``doc_stride``; a training window that does not contain the whole
answer (and every v2.0 unanswerable question) targets position 0 ([CLS]). Decoding keeps the
``n_best_size`` best starts and ends with end >= start, length <= ``max_answer_length``, start in
a window where it has maximal context; v2.0 predicts "" when ``null score - best span score >
null_score_diff_threshold``.

Outputs: ``predictions.json`` {id: text}, ``nbest_predictions.json`` and for v2.0
``null_odds.json`` {id: null score - best span score}, exactly what ``evaluate-v1.1.py`` /
``evaluate-v2.0.py --na-prob-file`` read. For v2.0 the dev evaluation also runs the official
best-threshold search over the null odds (``best_f1`` at ``best_f1_thresh``) and, as the
original README then re-runs prediction with ``--null_score_diff_threshold=best_f1_thresh``,
writes ``predictions_best_thresh.json`` (dev, and ``test_predictions_best_thresh.json`` for a test
split predicted after it) decoded at that threshold. ``predictions.json`` always uses
``config.task.null_score_diff_threshold``; predict mode has no dev set, so set that key to the
``best_f1_thresh`` found at training time (``eval_results.json``).

An ``answer_start`` that does not point at the answer text is an error naming the file and
question id; a training answer that cannot be recovered from the whitespace tokens is skipped
and counted (the original skips it with a warning).
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from bertjax import atomic
from bertjax.finetune import metrics as M
from bertjax.finetune import squad_decode
from bertjax.finetune.tasks import (
    Features,
    FinetuneInputError,
    Task,
    count,
    read_text,
    stack,
)

TASKS = {"squad_v1": "v1.1", "squad_v2": "v2.0"}


@dataclasses.dataclass
class SquadExample:
    qas_id: str
    question_text: str
    doc_tokens: list[str]
    answers: list[str]  # every gold answer text ([] for v2.0 unanswerable / test)
    start_position: int = -1  # word index of the (first) answer; -1 when none
    end_position: int = -1
    answer_text: str = ""
    is_impossible: bool = False


def _is_whitespace(ch: str) -> bool:
    return ch in " \t\r\n" or ord(ch) == 0x202F


def split_on_whitespace(text: str) -> tuple[list[str], list[int]]:
    """Words and, per character, the index of the word it belongs to (run_squad.py's scheme)."""
    words, char_to_word, previous_space = [], [], True
    for ch in text:
        if _is_whitespace(ch):
            previous_space = True
        else:
            if previous_space:
                words.append(ch)
            else:
                words[-1] += ch
            previous_space = False
        char_to_word.append(len(words) - 1)
    return words, char_to_word


def _field(node, key: str, kind: type, where: str):
    """``node[key]`` checked to be a ``kind`` (``int``: not a bool); FinetuneInputError naming
    ``where`` otherwise."""
    if not isinstance(node, dict):
        raise FinetuneInputError(f"{where}: expected a JSON object, got {_short(node)}")
    expected = {list: "a list", str: "a string", int: "an integer"}[kind]
    if key not in node:
        raise FinetuneInputError(f"{where}: no {key!r} field, expected {expected}")
    value = node[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise FinetuneInputError(f"{where}: {key!r} is {_short(value)}, expected {expected}")
    return value


def _short(value) -> str:
    text = repr(value)  # one line: repr escapes line breaks
    return text if len(text) <= 40 else text[:37] + "..."


def _answer_span(answer, context, char_to_word, where):
    """(start word, end word, text) of ``answer``, after checking its answer_start."""
    text = _field(answer, "text", str, where)
    start = _field(answer, "answer_start", int, where)
    if not text or start < 0 or context[start : start + len(text)] != text:
        raise FinetuneInputError(
            f"{where}: answer_start {start} does not point at the answer "
            f"{_short(text)} (the context has {_short(context[start : start + len(text)])} there)"
        )
    first, last = char_to_word[start], char_to_word[start + len(text) - 1]
    return first, last, text


class SquadTask(Task):
    head = "span"
    num_labels = 2
    train_split, dev_splits, test_splits = "train", ("dev",), ("test",)
    primary_metric = "f1"

    def __init__(self, name: str):
        self.name, self.version = name, TASKS[name]
        self.is_v2 = self.version == "v2.0"
        self.skipped: dict[str, int] = {}
        self.config = None
        self.best_threshold: float | None = None  # v2.0: dev best_f1_thresh, set by evaluate

    def split_path(self, data_dir: str, split: str) -> str:
        return os.path.join(data_dir, f"{split}-{self.version}.json")

    def read(self, data_dir: str, split: str) -> list[SquadExample]:
        path = self.split_path(data_dir, split)
        try:
            document = json.loads(read_text(path))
        except json.JSONDecodeError as e:
            raise FinetuneInputError(f"{path}: not a SQuAD JSON file ({e})") from None
        examples = []
        for a, article in enumerate(_field(document, "data", list, path)):
            paragraphs = _field(article, "paragraphs", list, f"{path}: data[{a}]")
            for p, paragraph in enumerate(paragraphs):
                where = f"{path}: data[{a}].paragraphs[{p}]"
                context = _field(paragraph, "context", str, where)
                words, char_to_word = split_on_whitespace(context)
                for q, qa in enumerate(_field(paragraph, "qas", list, where)):
                    qas_id = _field(qa, "id", str, f"{where}.qas[{q}]")
                    where_qa = f"{path}: question {_short(qas_id)}"
                    example = self._example(qa, context, words, char_to_word, where_qa, split)
                    if example is not None:
                        examples.append(example)
        return examples

    def _example(self, qa, context, words, char_to_word, where, split):
        question = _field(qa, "question", str, where)
        answers = _field(qa, "answers", list, where) if "answers" in qa else []
        impossible = qa.get("is_impossible", False)
        if not isinstance(impossible, bool):
            raise FinetuneInputError(
                f"{where}: 'is_impossible' is {_short(impossible)}, expected true or false"
            )
        impossible = impossible and self.is_v2
        texts = [] if impossible else [_field(a, "text", str, where) for a in answers]
        example = SquadExample(qa["id"], question, words, texts, is_impossible=impossible)
        if split != "train" or impossible:
            if split != "train" and texts:
                _answer_span(answers[0], context, char_to_word, where)  # validate offsets
            return example
        if len(answers) != 1:
            raise FinetuneInputError(
                f"{where}: a training question needs exactly 1 answer, got {len(answers)}"
            )
        first, last, text = _answer_span(answers[0], context, char_to_word, where)
        if " ".join(words[first : last + 1]).find(" ".join(text.split())) == -1:
            count(self.skipped, f"{split}: answer not recoverable from whitespace tokens")
            return None
        example.start_position, example.end_position, example.answer_text = first, last, text
        return example

    def featurize(self, examples, tokenizer, config) -> Features:
        self.config, self.tokenizer = config, tokenizer
        rows, meta = [], []
        for index, example in enumerate(examples):
            for row, info in _windows(example, tokenizer, config):
                rows.append(row)
                meta.append({**info, "example_index": index})
        keys = ("input_ids", "segment_ids", "input_mask", "start_positions", "end_positions")
        if not rows:
            raise FinetuneInputError("SQuAD: no features (empty input file?)")
        return Features(stack(rows, keys), meta, dict(self.skipped))

    def evaluate(self, examples, features, logits):
        """Official EM/F1; v2.0 adds ``best_*`` / ``best_*_thresh`` (evaluate-v2.0.py with the
        null odds) and ``best_f1_thresh_exact`` / ``best_f1_thresh_f1``: the predictions decoded
        again at ``best_f1_thresh``, which later ``write_predictions`` calls also write."""
        predictions, null_odds, nbest = self.decode(examples, features, logits)
        gold = {e.qas_id: e.answers for e in examples}
        result = M.squad_evaluate(gold, predictions, null_odds if self.is_v2 else None)
        if self.is_v2:
            self.best_threshold = result["best_f1_thresh"]
            again = squad_decode.threshold_predictions(nbest, null_odds, self.best_threshold)
            at_best = M.squad_evaluate(gold, again)
            result["best_f1_thresh_exact"], result["best_f1_thresh_f1"] = (
                at_best["exact"],
                at_best["f1"],
            )
        return result, predictions

    def decode(self, examples, features, logits):
        return squad_decode.decode(
            examples, features, logits, self.tokenizer, self.config, self.is_v2
        )

    def write_predictions(self, out_dir, split, examples, features, logits, with_labels=True):
        predictions, null_odds, nbest = self.decode(examples, features, logits)
        prefix = "" if split == "dev" else f"{split}_"
        paths = []
        outputs = [("predictions.json", predictions), ("nbest_predictions.json", nbest)]
        if self.is_v2:
            outputs.append(("null_odds.json", null_odds))
        if self.is_v2 and self.best_threshold is not None:
            again = squad_decode.threshold_predictions(nbest, null_odds, self.best_threshold)
            outputs.append(("predictions_best_thresh.json", again))
        for name, value in outputs:
            paths.append(os.path.join(out_dir, prefix + name))
            atomic.write_text(paths[-1], json.dumps(value, indent=2) + "\n")
        return paths


def _token_span(example, pieces_per_word, tokenizer):
    """The answer's sub-token span, tightened to the tokenized answer (``_improve_answer_span``)."""
    orig_to_tok = np.cumsum([0] + [len(p) for p in pieces_per_word])
    start = int(orig_to_tok[example.start_position])
    end = int(orig_to_tok[example.end_position + 1]) - 1
    answer = [i for word in tokenizer.encode_words(example.answer_text.split()) for i in word]
    doc = [i for p in pieces_per_word for i in p]
    for new_start in range(start, end + 1):
        for new_end in range(end, new_start - 1, -1):
            if doc[new_start : new_end + 1] == answer:
                return new_start, new_end
    return start, end


def max_context(spans: list[tuple[int, int]], span_index: int, position: int) -> bool:
    """Whether ``position`` has its most context (min of left/right + 0.01 length) in this span."""
    best, best_score = None, None
    for i, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best, best_score = i, score
    return best == span_index


def doc_spans(num_tokens: int, max_tokens: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) windows over the passage's sub-tokens."""
    spans, start = [], 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens)
        spans.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, stride)
    return spans


def _windows(example, tokenizer, config):
    """Yields (feature arrays, host metadata) for each doc-stride window of one example."""
    query = tokenizer.encode([example.question_text])[0][: config.task.max_query_length]
    pieces = tokenizer.encode_words(example.doc_tokens) if example.doc_tokens else []
    tok_to_orig = [w for w, p in enumerate(pieces) for _ in p]
    doc = [i for p in pieces for i in p]
    has_span = example.start_position >= 0
    tok_start, tok_end = _token_span(example, pieces, tokenizer) if has_span else (-1, -1)
    max_tokens = config.data.max_seq_length - len(query) - 3
    if max_tokens <= 0:
        raise FinetuneInputError(
            f"config.data.max_seq_length={config.data.max_seq_length} leaves no room "
            f"for the passage after a {len(query)}-piece question"
        )
    spans = doc_spans(len(doc), max_tokens, config.task.doc_stride)
    offset = len(query) + 2
    for span_index, (start, length) in enumerate(spans):
        ids = [
            tokenizer.cls_id,
            *query,
            tokenizer.sep_id,
            *doc[start : start + length],
            tokenizer.sep_id,
        ]
        segments = [0] * offset + [1] * (length + 1)
        to_orig = {offset + i: tok_to_orig[start + i] for i in range(length)}
        is_max = {offset + i: max_context(spans, span_index, start + i) for i in range(length)}
        start_position = end_position = 0
        if has_span and start <= tok_start and tok_end <= start + length - 1:
            start_position, end_position = tok_start - start + offset, tok_end - start + offset
        pad = config.data.max_seq_length - len(ids)
        row = {
            "input_ids": np.asarray(ids + [tokenizer.pad_id] * pad, np.int32),
            "segment_ids": np.asarray(segments + [0] * pad, np.int32),
            "input_mask": np.asarray([1] * len(ids) + [0] * pad, np.int32),
            "start_positions": np.int32(start_position),
            "end_positions": np.int32(end_position),
        }
        yield row, {"token_ids": ids, "token_to_orig_map": to_orig, "token_is_max_context": is_max}
