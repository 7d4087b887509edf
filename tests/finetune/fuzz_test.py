"""Fuzz tests of the fine-tuning readers (GLUE TSV, SQuAD JSON, CoNLL-2003, SWAG CSV): random
and mutated versions of the fixtures in tests/testdata/finetune/ are read, and each read returns
examples or raises a one-line FinetuneInputError naming the file (tests/fuzzing.py)."""

import json
import re

import hypothesis.strategies as st
import ml_collections
import pytest

from bertjax.finetune import glue, inputs, ner, squad, swag
from bertjax.finetune.tasks import FinetuneInputError
from tests.fuzzing import check_one_line, file_contents, fuzz, json_mutated


def _reads_or_fails_cleanly(task, data_dir, split, contents: bytes):
    path = task.split_path(str(data_dir), split)
    with open(path, "wb") as f:
        f.write(contents)
    try:
        examples = task.read(str(data_dir), split)
    except FinetuneInputError as e:
        check_one_line(e, path)
    else:
        assert isinstance(examples, list)


def _fixture_cases(testdata, cases):
    """``(task, split, fixture)`` triples -> a strategy of (task, split, file contents)."""
    return st.sampled_from(cases).flatmap(
        lambda case: st.tuples(
            st.just(case[0]),
            st.just(case[1]),
            file_contents((testdata / "finetune" / case[2]).read_bytes(), case[3]),
        )
    )


def test_glue_tsv(testdata, tmp_path, record_property):
    cases = [
        (glue.GlueTask("mrpc"), "train", "mrpc/train.tsv", b"\t"),
        (glue.GlueTask("mrpc"), "dev", "mrpc/dev.tsv", b"\t"),
        (glue.GlueTask("mrpc"), "test", "mrpc/test.tsv", b"\t"),
        (glue.GlueTask("stsb"), "dev", "stsb/dev.tsv", b"\t"),
        (glue.GlueTask("stsb"), "test", "stsb/test.tsv", b"\t"),
        (glue.GlueTask("cola"), "train", "mrpc/dev.tsv", b"\t"),  # headerless, 4 columns
        (glue.GlueTask("qqp"), "dev", "mrpc/dev.tsv", b"\t"),  # skips short rows
    ]
    fuzz(
        record_property,
        "GLUE TSV (glue.GlueTask.read)",
        _fixture_cases(testdata, cases),
        lambda case: _reads_or_fails_cleanly(case[0], tmp_path, case[1], case[2]),
        max_examples=300,
    )


def test_squad_json(testdata, tmp_path, record_property):
    fixtures = {
        name: json.loads((testdata / "finetune/squad" / f"{name}.json").read_text())
        for name in ("train-v1.1", "dev-v1.1", "train-v2.0", "dev-v2.0")
    }
    tasks = {"v1.1": squad.SquadTask("squad_v1"), "v2.0": squad.SquadTask("squad_v2")}

    def contents(name):
        original = json.dumps(fixtures[name], indent=1).encode()
        trees = json_mutated(fixtures[name]).map(lambda tree: json.dumps(tree).encode())
        return st.tuples(
            st.just(tasks[name.split("-")[1]]),
            st.just(name.split("-")[0]),
            trees | trees | file_contents(original, b","),
        )

    fuzz(
        record_property,
        "SQuAD JSON (squad.SquadTask.read)",
        st.sampled_from(sorted(fixtures)).flatmap(contents),
        lambda case: _reads_or_fails_cleanly(case[0], tmp_path, case[1], case[2]),
        max_examples=300,
    )


def test_conll(testdata, tmp_path, record_property):
    task = ner.NerTask("conll2003")
    cases = [(task, "train", "ner/train.txt", b" "), (task, "dev", "ner/dev.txt", b" ")]
    fuzz(
        record_property,
        "CoNLL-2003 (ner.NerTask.read)",
        _fixture_cases(testdata, cases),
        lambda case: _reads_or_fails_cleanly(case[0], tmp_path, case[1], case[2]),
        max_examples=200,
    )


WORD = st.text(st.characters(codec="utf-8", exclude_categories=("Z", "C")), min_size=1,
               max_size=8).filter(lambda w: w != "-DOCSTART-")  # fmt: skip


@st.composite
def _conll_document(draw):
    """(file bytes, [(words, labels)]) of a well-formed CoNLL file: sentences of words with
    labels from CoNLL-2003's set, each line ``word [POS CHUNK] label`` (the same width
    throughout), one or more blank lines (LF or CRLF) between sentences, ``-DOCSTART-`` lines
    among them; what any reader of the format must give back."""
    labels = ner.CONLL2003_LABELS
    sentences = draw(st.lists(st.lists(st.tuples(WORD, st.sampled_from(labels)), min_size=1,
                                       max_size=6), min_size=1, max_size=5))  # fmt: skip
    width = draw(st.sampled_from([2, 4]))
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    lines = []
    for sentence in sentences:
        lines += draw(st.sampled_from([[""], ["", ""], ["-DOCSTART- -X- -X- O", ""]]))
        middle = ["NN", "I-NP"][: width - 2]
        lines += [" ".join([word, *middle, label]) for word, label in sentence]
    text = newline.join(lines) + draw(st.sampled_from(["", newline]))
    expected = [([w for w, _ in s], [label for _, label in s]) for s in sentences]
    return text.encode("utf-8"), expected


def test_conll_reads_back_every_sentence_of_a_well_formed_file(tmp_path, record_property):
    """Against the format itself: the words and labels written are the sentences read, in
    order (a reader returning nothing, or dropping a sentence, a word or a label, fails)."""
    task = ner.NerTask("conll2003")

    def check(case):
        contents, expected = case
        (tmp_path / "train.txt").write_bytes(contents)
        got = [(s.words, s.labels) for s in task.read(str(tmp_path), "train")]
        assert got == expected

    fuzz(record_property, "CoNLL-2003 well-formed (ner.NerTask.read)", _conll_document(), check,
         max_examples=150)  # fmt: skip


def test_swag_csv(testdata, tmp_path, record_property):
    task = swag.SwagTask("swag")
    cases = [
        (task, "train", "swag/train.csv", b","),
        (task, "dev", "swag/val.csv", b","),
        (task, "test", "swag/val.csv", b","),
    ]
    fuzz(
        record_property,
        "SWAG CSV (swag.SwagTask.read)",
        _fixture_cases(testdata, cases),
        lambda case: _reads_or_fails_cleanly(case[0], tmp_path, case[1], case[2]),
        max_examples=200,
    )


@pytest.mark.parametrize(
    "task, split, contents",
    [
        (glue.GlueTask("mrpc"), "dev", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"),
        (ner.NerTask("conll2003"), "train", ""),
        (ner.NerTask("conll2003"), "dev", "-DOCSTART- -X- O O\n\n"),
        (
            swag.SwagTask("swag"),
            "dev",
            "video-id,fold-ind,startphrase,sent1,sent2,gold-source,"
            "ending0,ending1,ending2,ending3,label\n",
        ),
    ],
    ids=["GLUE header only", "CoNLL empty", "CoNLL only -DOCSTART-", "SWAG header only"],
)
def test_a_split_without_examples_is_an_error_naming_its_file(task, split, contents, tmp_path):
    """Read before training: an empty split never gets as far as featurizing or the model."""
    path = task.split_path(str(tmp_path), split)
    with open(path, "w") as f:
        f.write(contents)
    config = ml_collections.ConfigDict({"task": {"data_dir": str(tmp_path)}})
    with pytest.raises(FinetuneInputError) as error:
        inputs.Data(task, config, tokenizer=None, splits=[split])
    check_one_line(error.value, path)
    assert "no examples" in str(error.value)


def _squad(qa: dict, context: str = "abc def") -> str:
    return json.dumps({"data": [{"paragraphs": [{"context": context, "qas": [qa]}]}]})


@pytest.mark.parametrize(
    "name, contents, message",
    [
        ("dev-v1.1", '{"data": null}', "'data' is None, expected a list"),  # TypeError
        ("dev-v1.1", '{"data": [{}]}', "data[0]: no 'paragraphs' field"),  # KeyError
        # A negative answer_start slices from the end: "ab" == "abc"[-3:-1] passed as valid.
        (
            "train-v1.1",
            _squad({"id": "q", "question": "?", "answers": [{"text": "ab", "answer_start": -7}]}),
            "answer_start -7 does not point",
        ),
        # An empty answer text passed at any answer_start.
        (
            "dev-v1.1",
            _squad(
                {"id": "q", "question": "?", "answers": [{"text": "", "answer_start": 99}]},
                context="",
            ),
            "answer_start 99 does not point",
        ),
        # bool("false") is True: the question was silently unanswerable.
        (
            "train-v2.0",
            _squad({"id": "q", "question": "?", "is_impossible": "false", "answers": []}),
            "'is_impossible' is 'false', expected true or false",
        ),
    ],
    ids=["data null", "no paragraphs", "negative start", "empty answer", "is_impossible str"],
)
def test_squad_regressions(tmp_path, name, contents, message):
    split, version = name.split("-")
    task = squad.SquadTask("squad_v1" if version == "v1.1" else "squad_v2")
    path = tmp_path / f"{name}.json"
    path.write_text(contents)
    with pytest.raises(FinetuneInputError, match=re.escape(message)) as error:
        task.read(str(tmp_path), split)
    check_one_line(error.value, path)


def test_glue_header_narrower_than_the_task(tmp_path):
    """MRPC reads columns 0, 3 and 4: a 2-column header and rows raised IndexError."""
    (tmp_path / "dev.tsv").write_text("Quality\tString\n1\tThe cat sat.\n")
    with pytest.raises(FinetuneInputError, match="a mrpc train/dev file has at least 5") as error:
        glue.GlueTask("mrpc").read(str(tmp_path), "dev")
    check_one_line(error.value, tmp_path / "dev.tsv")
