"""Fine-tuning from a 'modernbert' checkpoint (``config.init_checkpoint``: its architecture and
vocab come from it, as for BERT): every head type runs through the real loop on the shipped
fixtures with HF's ``ModernBertFor*`` heads (``bertjax.model.heads``; their logits are checked
against transformers in tests/interop/modernbert_heads_test.py), GLUE packed as BERT packs,
and each writes the predictions its task scores. A BiLSTM head, which is BERT's, is one line."""

import json

import numpy as np
import pytest

from bertjax.finetune import loop
from bertjax.finetune.tasks import FinetuneInputError
from bertjax.training import checkpoint
from tests.finetune import loop_test


@pytest.mark.parametrize(
    "name,arg,task,data,overrides",
    [
        ("finetune_glue", None, "mrpc", "mrpc", {"data.pack_sequences": True}),
        ("finetune_ner", None, "conll2003", "ner", {}),
        ("finetune_squad", "v1", "squad_v1", "squad", {}),
        ("finetune_swag", None, "swag", "swag", {}),
    ],
)
def test_every_head_fine_tunes_from_a_modernbert_checkpoint(
    testdata, tiny_modernbert_checkpoint, tmp_path, name, arg, task, data, overrides
):
    config = loop_test._config(
        name, arg, task=task, data_dir=str(testdata / "finetune" / data),
        init_checkpoint=tiny_modernbert_checkpoint,
        overrides={"data.do_lower_case": True, **overrides},
    )  # fmt: skip
    results = loop.train_and_evaluate(config, str(tmp_path))
    assert np.isfinite(results["final_train_loss"])
    _, bert_config, meta = checkpoint.load_params(tmp_path / "checkpoint")
    assert bert_config.architecture == "modernbert" and bert_config.classifier_pooling == "mean"
    assert sorted(meta["heads"]) == ["classifier", "head"]  # HF's head and classifier, no pooler
    reported = json.loads((tmp_path / "eval_results.json").read_text())["dev"]["dev"]
    checks = {"squad": loop_test._check_squad, "ner": loop_test._check_ner,
              "swag": loop_test._check_swag}  # fmt: skip
    if data in checks:
        checks[data](tmp_path / "predictions", testdata / "finetune" / data, reported)
    else:
        assert (tmp_path / "predictions/MRPC.tsv").read_text().startswith("index\tprediction\n")


@pytest.mark.parametrize(
    "name,arg,task,data",
    [
        ("finetune_ner", None, "conll2003", "ner"),
        ("finetune_squad", "v1", "squad_v1", "squad"),
    ],
)
def test_word_split_tasks_fine_tune_from_a_bpe_checkpoint(
    testdata, tiny_modernbert_bpe_checkpoint, tmp_path, name, arg, task, data
):
    """A checkpoint whose vocab is a byte-level BPE tokenizer.json: NER's and SQuAD's words take
    their pieces after a space (``encode_words``), the fine-tuned checkpoint keeps the
    tokenizer.json, and the predictions score as the task's script scores them."""
    config = loop_test._config(
        name, arg, task=task, data_dir=str(testdata / "finetune" / data),
        init_checkpoint=tiny_modernbert_bpe_checkpoint,
    )  # fmt: skip
    results = loop.train_and_evaluate(config, str(tmp_path))
    assert np.isfinite(results["final_train_loss"])
    _, _, meta = checkpoint.load_params(tmp_path / "checkpoint")
    assert meta["tokenizer"] == "bpe" and (tmp_path / "checkpoint" / "tokenizer.json").exists()
    reported = json.loads((tmp_path / "eval_results.json").read_text())["dev"]["dev"]
    check = loop_test._check_ner if data == "ner" else loop_test._check_squad
    check(tmp_path / "predictions", testdata / "finetune" / data, reported)


def test_a_bilstm_head_on_modernbert_is_one_line(testdata, tiny_modernbert_checkpoint, tmp_path):
    config = loop_test._config(
        "finetune_glue", task="mrpc", data_dir=str(testdata / "finetune/mrpc"),
        init_checkpoint=tiny_modernbert_checkpoint, overrides={"model.head_rnn": "bilstm"},
    )  # fmt: skip
    with pytest.raises(FinetuneInputError, match="architecture 'modernbert' has HF's prediction"):
        loop.train_and_evaluate(config, str(tmp_path))
