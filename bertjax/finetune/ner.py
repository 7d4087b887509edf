"""CoNLL-2003 NER (paper §5.3), and WNUT-16 in its format: column files, a label on each first
WordPiece, conlleval.

Files in ``config.task.data_dir``: ``train.txt``, ``dev.txt`` (or ``valid.txt`` / ``eng.testa``),
``test.txt`` (or ``eng.testb``); one token per line with the word first and the NER tag last
(``EU NNP B-NP B-ORG``), blank lines between sentences, ``-DOCSTART-`` lines ignored. Tags may be
IOB1 (the original release) or IOB2; scoring is conlleval's, which handles both.

Each word is split into WordPieces; the word's label is predicted from its first piece (the other
pieces get weight 0), as the paper does with a cased vocabulary. Pieces past
``max_seq_length - 2`` are cut; the cut words are predicted ``O`` and counted in ``skipped``.
Predictions are written as ``{split}_predictions.txt`` in conlleval's input format
(``word gold predicted``).
"""

from __future__ import annotations

import dataclasses
import io
import os

import numpy as np
from etils import epath

from bertjax import atomic
from bertjax.finetune import metrics as M
from bertjax.finetune.tasks import (
    Features,
    FinetuneInputError,
    Task,
    count,
    label_index,
    pack,
    read_text,
    stack,
)

CONLL2003_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
# WNUT-16 (Strauss et al., 2016: named entities in tweets), its ten types in BIO tags.
WNUT16_TYPES = ("company", "facility", "geo-loc", "movie", "musicartist", "other", "person",
                "product", "sportsteam", "tvshow")  # fmt: skip
WNUT16_LABELS = ("O", *(f"{bio}-{kind}" for kind in WNUT16_TYPES for bio in ("B", "I")))
TASKS = {"conll2003": CONLL2003_LABELS, "wnut16": WNUT16_LABELS}
_FILES = {
    "train": ("train.txt", "eng.train"),
    "dev": ("dev.txt", "valid.txt", "eng.testa"),
    "test": ("test.txt", "eng.testb"),
}


@dataclasses.dataclass
class Sentence:
    words: list[str]
    labels: list[str]
    where: str  # "file:line" of the first word


class NerTask(Task):
    head = "tagging"
    train_split, dev_splits, test_splits = "train", ("dev",), ("test",)
    primary_metric = "f1"

    def __init__(self, name: str):
        self.name = name
        self.label_list = TASKS[name]
        self.num_labels = len(self.label_list)
        self.skipped: dict[str, int] = {}

    def split_path(self, data_dir: str, split: str) -> str:
        candidates = [os.path.join(data_dir, f) for f in _FILES[split]]
        return next((p for p in candidates if epath.Path(p).exists()), candidates[0])

    def read(self, data_dir: str, split: str) -> list[Sentence]:
        path = self.split_path(data_dir, split)
        sentences, words, labels, start, width = [], [], [], 0, None
        with io.StringIO(read_text(path), newline=None) as f:  # universal newlines, as open()
            for line_number, line in enumerate(f, 1):
                fields = line.split()
                if not fields or fields[0] == "-DOCSTART-":
                    if words:
                        sentences.append(Sentence(words, labels, f"{path}:{start}"))
                    words, labels = [], []
                    continue
                width = width or len(fields)
                if len(fields) != width or width < 2:
                    raise FinetuneInputError(
                        f"{path}:{line_number}: expected {max(width, 2)} "
                        f"space-separated columns, got {len(fields)}"
                    )
                label_index(self.label_list, fields[-1], f"{path}:{line_number}")
                start = start if words else line_number
                words.append(fields[0])
                labels.append(fields[-1])
        if words:
            sentences.append(Sentence(words, labels, f"{path}:{start}"))
        return sentences

    def featurize(self, sentences: list[Sentence], tokenizer, config) -> Features:
        max_pieces = config.data.max_seq_length - 2
        rows, meta, skipped = [], [], {}
        for sentence in sentences:
            pieces = tokenizer.encode_words(sentence.words)
            ids, first_piece = [], []
            for word_pieces in pieces:
                cut = len(first_piece) > 0 and first_piece[-1] == -2
                if cut or len(ids) + len(word_pieces) > max_pieces:
                    count(skipped, "words cut (predicted O)")
                    first_piece.append(-2)  # -2: cut, and so is every later word
                    continue
                if not word_pieces:
                    count(skipped, "words with no WordPiece (predicted O)")
                    first_piece.append(-1)
                    continue
                first_piece.append(len(ids) + 1)  # +1: [CLS]
                ids += word_pieces
            input_ids, segment_ids, input_mask = pack(
                tokenizer, ids, None, config.data.max_seq_length
            )
            label_ids = np.zeros(config.data.max_seq_length, np.int32)
            weights = np.zeros(config.data.max_seq_length, np.float32)
            for position, label in zip(first_piece, sentence.labels, strict=True):
                if position >= 0:
                    label_ids[position] = self.label_list.index(label)
                    weights[position] = 1.0
            rows.append(
                dict(
                    input_ids=input_ids,
                    segment_ids=segment_ids,
                    input_mask=input_mask,
                    label_ids=label_ids,
                    label_weights=weights,
                )
            )
            meta.append(first_piece)
        keys = ("input_ids", "segment_ids", "input_mask", "label_ids", "label_weights")
        if not rows:
            raise FinetuneInputError("CoNLL: no sentences (empty input file?)")
        return Features(stack(rows, keys), meta, skipped)

    def predicted_tags(self, features, logits: np.ndarray) -> list[list[str]]:
        """<float32>[N, L, C] -> per sentence, one tag per word (``O`` for cut words)."""
        best = np.argmax(logits, axis=-1)
        return [
            [self.label_list[best[i, p]] if p >= 0 else "O" for p in first_piece]
            for i, first_piece in enumerate(features.meta)
        ]

    def evaluate(self, sentences, features, logits):
        predicted = self.predicted_tags(features, logits)
        result = M.conlleval([s.labels for s in sentences], predicted)
        result["num_sentences"] = len(sentences)
        return result, predicted

    def write_predictions(self, out_dir, split, sentences, features, logits, with_labels=True):
        predicted = self.predicted_tags(features, logits)
        lines = []
        for sentence, tags in zip(sentences, predicted, strict=True):
            lines += [
                f"{w} {g} {p}"
                for w, g, p in zip(sentence.words, sentence.labels, tags, strict=True)
            ]
            lines.append("")
        path = os.path.join(out_dir, f"{split}_predictions.txt")
        atomic.write_text(path, "\n".join(lines) + "\n")
        return [path]
