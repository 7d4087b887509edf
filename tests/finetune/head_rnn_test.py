"""Fine-tuning with a randomly initialised BiLSTM between the encoder and the task head
(``config.model.head_rnn='bilstm'``, the paper's Table 5 "+ BiLSTM"), through the real entry
point on the shipped fixtures: a token task (NER) and a sequence task (MRPC) train and learn, their
checkpoints hold the BiLSTM (and no pooler: sentence heads read its final states), and what
cannot be done is one line naming the field (a bad ``head_rnn*``, predicting with another head,
exporting to HF). The head's outputs against PyTorch: ``heads_test.py``."""

import importlib.util
import pathlib
import re

import pytest

from bertjax.finetune import loop, objective
from bertjax.finetune.tasks import FinetuneInputError
from bertjax.interop import formats, hf
from bertjax.interop.converted import ConvertError
from bertjax.model.config import BertConfig
from bertjax.training import checkpoint

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests/testdata/finetune"


def _config(name: str, data_dir: str, init_checkpoint: str, overrides: dict | None = None):
    spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.update_from_flattened_dict({
        "task.data_dir": data_dir, "init_checkpoint": init_checkpoint,
        "data.max_seq_length": 16, "train.global_batch_size": 8, "train.eval_batch_size": 8,
        "train.log_every": 1, "optimizer.learning_rate": 1e-2, "model.hidden_dropout_rate": 0.0,
        "model.attention_dropout_rate": 0.0, "model.head_rnn": "bilstm",
        "model.head_rnn_size": 8, **(overrides or {}),
    })  # fmt: skip
    return config


def _first_and_last_loss(text: str) -> tuple[float, float]:
    losses = [float(x) for x in re.findall(r"^step \d+/\d+ loss ([\d.]+)", text, re.M)]
    assert len(losses) > 2, text
    return losses[0], losses[-1]


def test_ner_with_a_bilstm_head_learns_and_is_not_exported_to_hf(
    tiny_encoder_checkpoint, tmp_path, capsys
):
    config = _config("finetune_ner", str(DATA / "ner"), tiny_encoder_checkpoint,
                     {"train.num_epochs": 15.0})  # fmt: skip
    results = loop.train_and_evaluate(config, str(tmp_path))
    first, last = _first_and_last_loss(capsys.readouterr().out)
    assert last < 0.7 * first  # ln 9 = 2.20 at the start
    assert {"f1", "precision", "recall"} <= set(results["dev"]["dev"])
    params, _, meta = checkpoint.load_params(tmp_path / "checkpoint")
    assert sorted(meta["heads"]) == ["bilstm", "classifier"]
    assert params["bilstm"]["layer_0"]["forward_rnn"]["cell"]["ii"]["kernel"].shape == (32, 8)
    assert params["classifier"]["dense"]["kernel"].shape == (16, 9)  # 2R -> the 9 tags
    converted = formats.load(str(tmp_path / "checkpoint"))
    with pytest.raises(ConvertError, match="a BiLSTM head .*cannot be exported to HF") as error:
        hf.write(str(tmp_path / "hf"), converted)
    assert "\n" not in str(error.value) and not (tmp_path / "hf").exists()


def test_classification_with_a_bilstm_head_reads_its_final_states(
    tiny_encoder_checkpoint, tmp_path, capsys
):
    overrides = {"task.name": "mrpc", "train.num_epochs": 20.0, "train.global_batch_size": 16}
    config = _config("finetune_glue", str(DATA / "mrpc"), tiny_encoder_checkpoint, overrides)
    results = loop.train_and_evaluate(config, str(tmp_path))
    first, last = _first_and_last_loss(capsys.readouterr().out)
    assert last < 0.7 * first
    assert {"accuracy", "f1"} <= set(results["dev"]["dev"])
    assert (tmp_path / "predictions/MRPC.tsv").exists()
    _, _, meta = checkpoint.load_params(tmp_path / "checkpoint")
    assert sorted(meta["heads"]) == ["bilstm", "classifier"]  # the pooler is not read
    # Predicting with another head than the checkpoint's is one line naming the field.
    config.mode, config.model.head_rnn = "predict", "none"
    with pytest.raises(FinetuneInputError, match=r"config.model.head_rnn='none'") as error:
        loop.predict(config, str(tmp_path))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"model.head_rnn": "gru"}, "config.model.head_rnn='gru': expected one of"),
        ({"model.head_rnn_size": -1}, "config.model.head_rnn_size=-1: expected units"),
        ({"model.head_rnn_layers": 0}, "config.model.head_rnn_layers=0: expected a positive"),
    ],
)
def test_a_bad_head_rnn_is_one_line_naming_the_field(overrides, message):
    config = _config("finetune_ner", "", "", overrides)
    with pytest.raises(FinetuneInputError, match=re.escape(message)) as error:
        objective.head_rnn(config, BertConfig(hidden_size=32, num_heads=2))
    assert "\n" not in str(error.value)


def test_head_rnn_size_0_is_the_encoders_hidden_size():
    config = _config("finetune_ner", "", "", {"model.head_rnn_size": 0})
    rnn = objective.head_rnn(config, BertConfig(hidden_size=32, num_heads=2))
    assert (rnn.hidden_size, rnn.num_layers) == (32, 1)
    config.model.head_rnn = "none"
    assert objective.head_rnn(config, BertConfig(hidden_size=32, num_heads=2)) is None
