"""The paper miniature's fine-tuning tasks (issue #38 item 3), converted to layouts that
bertjax's readers already take, with human labels only:

* ``vitaminc``: VitaminC claim/evidence pairs (3-way) in the MNLI TSV layout (``task=mnli``).
  ``dev_matched.tsv`` is the dev split, the one the sweep selects by (``sweep.py`` reads
  ``dev_splits[0]``); ``dev_mismatched.tsv`` is the held-out test split, labelled, so every run
  also reports it untouched by selection.
* ``qnli``: QNLI built from SQuAD v1.1 dev and SQuADShifts' new Wikipedia set as GLUE built QNLI
  from SQuAD: a question paired with the context sentence that holds its crowd-marked answer
  (``entailment``) and with the other sentence of the paragraph that shares most words with it
  (``not_entailment``), so the classes are balanced and the negative is not trivial
  (``task=qnli``). ``test.tsv`` is in the GLUE test layout (bertjax predicts it), its labels in
  ``test_labels.tsv``.
* ``squad``: the same articles as SQuAD v1.1 JSON (``task=squad_v1``), answers whose
  ``answer_start`` does not point at their text dropped.
* ``wnut16``: WNUT-16 Twitter NER (BIO), CoNLL layout: ``wnut16/`` with its own ten types
  (``task.name=wnut16``, ``bertjax.finetune.ner.WNUT16_LABELS``), ``wnut16_conll/`` with the
  types folded into CoNLL-2003's four (``task.name=conll2003``).

Splits are by group, by a hash of the group's key, so related examples never straddle splits:
VitaminC by connected claims, evidences and pages (its pairs are contrastive: one claim with two
revisions of a sentence), SQuAD/QNLI by article, WNUT by tweet.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json

from bench.paper import corpus
from bertjax import atomic

SPLITS = ("train", "dev", "test")
_VITAMINC_LABELS = {"True": "entailment", "False": "contradiction", "Neither": "neutral"}
_MNLI_HEADER = (
    "index promptID pairID genre sentence1_binary_parse sentence2_binary_parse sentence1_parse "
    "sentence2_parse sentence1 sentence2 label1 gold_label"
).split()
WNUT_TYPES = (
    "company facility geo-loc movie musicartist other person product sportsteam tvshow".split()
)
# CoNLL-2003's types for WNUT's: people, organisations, places; works, products, bands and the
# rest are MISC (a band can be PER or ORG in CoNLL, so neither is right for musicartist).
WNUT_TO_CONLL = {
    "person": "PER",
    "company": "ORG",
    "sportsteam": "ORG",
    "geo-loc": "LOC",
    "facility": "LOC",
    "musicartist": "MISC",
    "movie": "MISC",
    "tvshow": "MISC",
    "product": "MISC",
    "other": "MISC",
}
_STOPWORDS = frozenset(
    "a an the of in on at to for by with from and or is was are were be been what which who whom "
    "whose when where why how did do does that this these those it its as".split()
)


def split_of(key: str, dev_percent: int = 10, test_percent: int = 10) -> str:
    """``train``, ``dev`` or ``test`` for a group key, by its hash (stable across runs)."""
    bucket = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 100
    if bucket < dev_percent:
        return "dev"
    return "test" if bucket < dev_percent + test_percent else "train"


def _clean(text: str) -> str:
    """One TSV field: no tab or line break (GLUE TSVs are unquoted); U+FFFD (a lost non-breaking
    space in VitaminC) becomes a space."""
    return " ".join(text.replace("\ufffd", " ").split())


@dataclasses.dataclass(frozen=True)
class Pair:
    group: str
    text_a: str
    text_b: str
    label: str


# VitaminC.


def vitaminc_pairs(examples: list[dict]) -> dict[str, list[Pair]]:
    """BIG-bench ``vitaminc_fact_verification`` examples (input ``"{page}: {evidence}\\nClaim:
    {claim}"``, one-hot ``target_scores`` over True/False/Neither) -> pairs per split, the
    premise the evidence with its page title, the hypothesis the claim."""
    rows = []
    for example in examples:
        evidence, claim = example["input"].split("\nClaim: ", 1)
        scores = example["target_scores"]
        answer = max(scores, key=scores.get)
        if sorted(scores.values()) != [0, 0, 1] or answer not in _VITAMINC_LABELS:
            raise ValueError(f"VitaminC example {example['input'][:60]!r}: scores {scores}")
        page = evidence.split(": ", 1)[0]
        keys = ("page:" + page, "claim:" + _norm(claim), "evidence:" + _norm(evidence))
        rows.append((keys, _clean(evidence), _clean(claim), _VITAMINC_LABELS[answer]))
    groups = _connected([keys for keys, *_ in rows])
    out = {split: [] for split in SPLITS}
    for keys, premise, hypothesis, label in rows:
        group = groups[keys[0]]
        group_id = hashlib.sha256(group.encode()).hexdigest()[:12]
        out[split_of("vitaminc:" + group)].append(Pair(group_id, premise, hypothesis, label))
    return out


def _norm(text: str) -> str:
    return " ".join(corpus.words(text))


def _connected(key_lists: list[tuple[str, ...]]) -> dict[str, str]:
    """Union-find over keys that occur together: key -> the smallest key of its component."""
    parent: dict[str, str] = {}

    def find(key):
        parent.setdefault(key, key)
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    for keys in key_lists:
        roots = sorted({find(k) for k in keys})
        for root in roots[1:]:
            parent[root] = roots[0]
    return {key: find(key) for key in parent}


def mnli_tsv(pairs: list[Pair], genre: str) -> str:
    """MNLI's train/dev layout (``glue.TASKS['mnli']``: texts in columns 8 and 9, the gold label
    last)."""
    lines = ["\t".join(_MNLI_HEADER)]
    for i, p in enumerate(pairs):
        row = [str(i), p.group, f"{i}", genre, "", "", "", "", p.text_a, p.text_b, p.label]
        lines.append("\t".join([*row, p.label]))
    return "\n".join(lines) + "\n"


# SQuAD -> QNLI and SQuAD v1.1.


def squad_articles(squad_files: list[dict]) -> tuple[dict[str, list[dict]], collections.Counter]:
    """SQuAD-format files -> articles per split (by title), each answer checked: one whose
    ``answer_start`` does not point at its text is dropped, a question left with none too."""
    out, dropped = {split: [] for split in SPLITS}, collections.Counter()
    for squad in squad_files:
        for article in squad["data"]:
            paragraphs = []
            for paragraph in article["paragraphs"]:
                context, questions = paragraph["context"], []
                for qa in paragraph["qas"]:
                    answers = [
                        a
                        for a in qa["answers"]
                        if context[a["answer_start"] :].startswith(a["text"]) and a["text"]
                    ]
                    dropped["answers"] += len(qa["answers"]) - len(answers)
                    if answers:
                        questions.append(
                            {"id": qa["id"], "question": qa["question"], "answers": answers}
                        )
                    else:
                        dropped["questions"] += 1
                if questions:
                    paragraphs.append({"context": context, "qas": questions})
            title = article["title"]
            out[split_of("squad:" + title)].append({"title": title, "paragraphs": paragraphs})
    return out, dropped


def qnli_pairs(articles: list[dict]) -> tuple[list[Pair], collections.Counter]:
    """Two pairs per question (see the module docstring); a question whose answer crosses a
    sentence boundary, or whose paragraph has one sentence, is skipped and counted."""
    pairs, skipped = [], collections.Counter()
    for article in articles:
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            spans = corpus.sentence_spans(context)
            for qa in paragraph["qas"]:
                answer = qa["answers"][0]
                start, end = answer["answer_start"], answer["answer_start"] + len(answer["text"])
                holding = [i for i, (a, b) in enumerate(spans) if a <= start and end <= b]
                if len(spans) < 2 or not holding:
                    skipped["one sentence" if len(spans) < 2 else "answer across sentences"] += 1
                    continue
                question = set(corpus.words(qa["question"])) - _STOPWORDS
                others = [i for i in range(len(spans)) if i != holding[0]]
                overlap = [
                    len(question & set(corpus.words(context[slice(*spans[i])]))) for i in others
                ]
                negative = others[overlap.index(max(overlap))]  # the first of the best
                for i, label in ((holding[0], "entailment"), (negative, "not_entailment")):
                    sentence = context[slice(*spans[i])]
                    pairs.append(Pair(qa["id"], _clean(qa["question"]), _clean(sentence), label))
    return pairs, skipped


def qnli_tsv(pairs: list[Pair], with_labels: bool = True) -> str:
    """QNLI's layout: ``index question sentence label`` (the test layout has no label)."""
    header = ["index", "question", "sentence", "label"][: 4 if with_labels else 3]
    rows = [[str(i), p.text_a, p.text_b, p.label][: len(header)] for i, p in enumerate(pairs)]
    return "\n".join("\t".join(r) for r in [header, *rows]) + "\n"


def squad_json(articles: list[dict], training: bool) -> str:
    """SQuAD v1.1 JSON; a training question keeps its first answer only (``run_squad.py`` and
    ``squad.SquadTask`` take exactly one), dev/test questions all of theirs."""
    if training:
        articles = [
            {
                "title": a["title"],
                "paragraphs": [
                    {
                        "context": p["context"],
                        "qas": [{**q, "answers": q["answers"][:1]} for q in p["qas"]],
                    }
                    for p in a["paragraphs"]
                ],
            }
            for a in articles
        ]
    return json.dumps({"version": "1.1", "data": articles}, ensure_ascii=False)


# WNUT-16.


def wnut_sentences(text: str) -> list[list[tuple[str, str]]]:
    """WNUT-16's ``word<TAB>tag`` lines (a blank or tab-only line between tweets) -> tweets as
    (word, tag) lists; a tag outside its BIO set or a word with a space is an error."""
    tags = {"O"} | {f"{p}-{t}" for p in "BI" for t in WNUT_TYPES}
    tweets, tweet = [], []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            if tweet:
                tweets.append(tweet)
            tweet = []
            continue
        word, tag = line.rstrip("\r").split("\t")
        if tag not in tags or not word or word != word.strip() or " " in word:
            raise ValueError(f"WNUT line {number}: {line!r} is not 'word<TAB>tag' with a BIO tag")
        tweet.append((word, tag))
    if tweet:
        tweets.append(tweet)
    return tweets


def wnut_splits(tweets: list[list[tuple[str, str]]]) -> dict[str, list]:
    """Tweets per split (60/20/20 by the tweet's words: dev and test need hundreds of
    entities); a tweet repeated word for word is kept once."""
    out, seen = {split: [] for split in SPLITS}, set()
    for tweet in tweets:
        key = " ".join(w for w, _ in tweet)
        if key not in seen:
            seen.add(key)
            out[split_of("wnut16:" + key, dev_percent=20, test_percent=20)].append(tweet)
    return out


def to_conll_tags(tweet: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(w, t if t == "O" else f"{t[:2]}{WNUT_TO_CONLL[t[2:]]}") for w, t in tweet]


def conll_text(tweets: list[list[tuple[str, str]]]) -> str:
    """CoNLL layout (``ner.NerTask``): ``word tag`` per line, a blank line after each sentence."""
    return "".join("".join(f"{w} {t}\n" for w, t in tweet) + "\n" for tweet in tweets)


# Statistics.


def label_stats(labels: list[str]) -> dict:
    """Counts, and the majority-class baseline in percent."""
    counts = collections.Counter(labels)
    majority = max(counts.values()) if counts else 0
    return {
        "examples": len(labels),
        "labels": dict(sorted(counts.items())),
        "majority_baseline": round(100.0 * majority / max(len(labels), 1), 2),
    }


def entity_stats(tweets: list[list[tuple[str, str]]]) -> dict:
    types = collections.Counter(t[2:] for tweet in tweets for _, t in tweet if t.startswith("B-"))
    return {
        "sentences": len(tweets),
        "tokens": sum(map(len, tweets)),
        "entities": sum(types.values()),
        "types": dict(sorted(types.items())),
    }


def write_text(path: str, text: str) -> None:
    atomic.write_text(path, text)
