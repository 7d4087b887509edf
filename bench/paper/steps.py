"""The plan's three in-process steps. The two that copy files write their output whole or not
at all (a temporary directory renamed into place).

- :func:`subset`: a task folder with ``train_examples`` / ``dev_examples`` examples of its train
  and dev files (0 = all), chosen by hash (:func:`spread`) and kept in file order. The data's
  files are grouped by article or page (bench/paper/DATA.md), so a sample over the whole file,
  not the first N, spans them. TSVs keep their header; CoNLL files are cut at sentence
  (blank-line) boundaries; SQuAD JSON keeps its chosen questions, in their paragraphs and
  articles (those left with none are dropped);
  the test files the readers do not require are not copied (the miniature reports dev, as the
  paper's ablations do).
- :func:`snapshot`: step S of a pretraining workdir as a workdir that holds only that step: the
  record files beside ``checkpoints/S/`` (layout: ``bertjax.training.checkpoint``), which
  ``init_checkpoint`` reads as its newest verified step.
- :func:`gate`: whether the gated models' sweeps on a task beat its trivial baseline (the
  majority class of a classification task's dev subset; 0 for span and entity F1) by a margin
  with their best runs: the protocol check before the other models are fine-tuned on it.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import shutil
import tempfile

from bertjax.training import checkpoint, workdir

# Every labelled evaluation split the task's reader requires (MNLI's reader reads both of its;
# VitaminC's dev_mismatched.tsv is its test split, bench/paper/DATA.md); the sweep selects by the
# first.
DEV_FILES = ("dev.tsv", "dev_matched.tsv", "dev_mismatched.tsv", "dev.txt", "dev-v1.1.json")
TRAIN_FILES = ("train.tsv", "train.txt", "train-v1.1.json")
RECORD_FILES = (workdir.META_FILE, checkpoint.CONFIG_FILE, "config.json")  # and the vocab


class StepError(ValueError):
    """A step's input is missing or unusable; the message is one line naming it."""


class GateFailed(StepError):
    """A gate's verdict against its models: ``verdict`` holds what a passed gate returns."""

    def __init__(self, message: str, verdict: dict):
        super().__init__(message)
        self.verdict = verdict


def _examples(text: str, conll: bool) -> tuple[str, list[str]]:
    """(header, examples): TSV rows after the header, or CoNLL blank-line-separated blocks."""
    if conll:
        return "", [b.strip("\n") + "\n" for b in text.split("\n\n") if b.strip()]
    header, _, rest = text.partition("\n")
    return header + "\n", [line + "\n" for line in rest.splitlines() if line]


def spread(items: list, wanted: int) -> list:
    """``wanted`` of ``items`` (0: all of them), in their order: those whose sha256 of (index,
    item) is smallest, so spread over the whole file with no period. A stride would alias with a
    file's own period: QNLI's rows alternate entailment / not_entailment, and every 8th row of
    them is all one label."""
    if wanted <= 0 or len(items) <= wanted:
        return list(items)
    key = lambda i: hashlib.sha256(f"{i}\t{items[i]}".encode()).digest()  # noqa: E731
    return [items[i] for i in sorted(sorted(range(len(items)), key=key)[:wanted])]


def _subset_squad(text: str, source: str, wanted: int) -> tuple[str, int]:
    """SQuAD v1.1 JSON with the spread questions; paragraphs and articles left empty dropped."""
    try:
        data = json.loads(text)
        questions = [qa["id"] for a in data["data"] for p in a["paragraphs"] for qa in p["qas"]]
    except (ValueError, KeyError, TypeError) as e:
        raise StepError(f"{source}: not SQuAD v1.1 JSON ({e})") from None
    kept = set(spread(questions, wanted))
    articles = []
    for article in data["data"]:
        paragraphs = []
        for paragraph in article["paragraphs"]:
            qas = [qa for qa in paragraph["qas"] if qa["id"] in kept]
            if qas:
                paragraphs.append({**paragraph, "qas": qas})
        if paragraphs:
            articles.append({**article, "paragraphs": paragraphs})
    return json.dumps({**data, "data": articles}), len(kept)


def _subset_file(source: str, dest: str, wanted: int) -> int:
    with open(source, encoding="utf-8") as f:
        text = f.read()
    if source.endswith(".json"):
        out, count = _subset_squad(text, source, wanted)
        if not count:
            raise StepError(f"{source}: no questions")
        with open(dest, "w", encoding="utf-8") as f:
            f.write(out)
        return count
    conll = source.endswith(".txt")
    header, examples = _examples(text, conll)
    kept = spread(examples, wanted)
    if not kept:
        raise StepError(f"{source}: no examples")
    with open(dest, "w", encoding="utf-8") as f:
        f.write(header + ("\n" if conll else "").join(kept))
    return len(kept)


def subset(source: str, dest: str, train_examples: int, dev_examples: int) -> dict:
    """Writes the task folder ``dest`` from ``source``; returns {file: examples kept}."""
    names = [n for n in (*TRAIN_FILES, *DEV_FILES) if os.path.exists(os.path.join(source, n))]
    if not any(n in TRAIN_FILES for n in names) or not any(n in DEV_FILES for n in names):
        raise StepError(f"{source}: expected a train and a dev file ({', '.join(DEV_FILES)})")
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".subset-", dir=os.path.dirname(dest))
    counts = {}
    for name in names:
        wanted = train_examples if name in TRAIN_FILES else dev_examples
        counts[name] = _subset_file(os.path.join(source, name), os.path.join(staging, name), wanted)
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(staging, dest)
    return counts


def snapshot(source: str, step: int, dest: str) -> dict:
    """Copies step ``step`` of the pretraining workdir ``source`` (and its record) to ``dest``."""
    step_dir = os.path.join(source, workdir.CHECKPOINTS_DIR, str(step))
    if not os.path.isdir(step_dir):
        names = os.listdir(os.path.join(source, workdir.CHECKPOINTS_DIR))
        kept = sorted((n for n in names if n.isdigit()), key=int)
        raise StepError(
            f"{step_dir}: no such step (kept: {', '.join(kept) or 'none'}); "
            "config.checkpoint.keep_every must divide every curve step"
        )
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".snapshot-", dir=os.path.dirname(dest))
    with open(os.path.join(source, workdir.META_FILE), encoding="utf-8") as f:
        vocab = checkpoint.vocab_in(source, json.load(f)).name  # the recorded tokenizer's file
    for name in (*RECORD_FILES, vocab):
        shutil.copy2(os.path.join(source, name), os.path.join(staging, name))
    shutil.copytree(step_dir, os.path.join(staging, workdir.CHECKPOINTS_DIR, str(step)))
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(staging, dest)
    return {"source": source, "step": step}


def trivial_baseline(task_dir: str) -> float:
    """The dev score of always answering the same: the majority class's share (in %) of a GLUE
    TSV's labels (its last column), or 0 for span and entity F1 (no answer, no entity)."""
    path = os.path.join(task_dir, "dev.tsv")
    if not os.path.exists(path):
        return 0.0
    with open(path, encoding="utf-8") as f:
        labels = [line.rstrip("\n").split("\t")[-1] for line in f.readlines()[1:] if line.strip()]
    if not labels:
        raise StepError(f"{path}: no examples")
    return 100.0 * collections.Counter(labels).most_common(1)[0][1] / len(labels)


def gate(task_dir: str, sweeps: dict[str, dict], margin: float) -> dict:
    """{baseline, best score per model}; a StepError naming each model whose best run of its
    ``sweeps[model]`` (``bertjax.finetune.sweep``'s results) is not ``margin`` points above
    the task's trivial baseline."""
    baseline = trivial_baseline(task_dir)
    best = {m: max(float(r["score"]) for r in sweep["rows"]) for m, sweep in sweeps.items()}
    below = [f"{m} {b:.1f}" for m, b in best.items() if b < baseline + margin]
    verdict = {"baseline": baseline, "margin": margin, "best": best}
    if below:
        raise GateFailed(
            f"{task_dir}: {', '.join(below)} not {margin:g} points above the trivial baseline "
            f"{baseline:.1f}: the task is not learnt at this scale",
            verdict,
        )
    return verdict
