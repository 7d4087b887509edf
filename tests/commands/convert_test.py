"""``python -m bertjax.convert``, run as users run it (in this process, the module as ``__main__``
with absl parsing its flags: ``tests.commands.in_process``, a start-up of imports saved per
run): HF -> bertjax -> HF bit-exact, a fine-tuned GLUE checkpoint -> the HF class transformers
loads, and bad input as one line with nothing left behind. What it converts and how is tested
in ``tests/interop/``.
"""

import json
import shutil

import pytest
import transformers

from bertjax.training import checkpoint
from tests.commands import in_process
from tests.interop import references
from tests.interop.tasks_export_test import fine_tuned, get_task


@pytest.fixture(scope="module")
def small_pretraining(tmp_path_factory):
    model = references.random_pretraining(1, **references.SMALL)
    return model, references.hf_dir(model, tmp_path_factory.mktemp("hf_small"))


def _run_cli(*args):
    return in_process.run_module("bertjax.convert", *args)


def test_round_trip_cli_bit_exact(small_pretraining, tmp_path):
    model, path = small_pretraining
    result = _run_cli(f"--src={path}", f"--dst={tmp_path / 'bj'}", "--to=bertjax")
    assert result.returncode == 0, result.stderr
    assert checkpoint.is_params_checkpoint(tmp_path / "bj")
    result = _run_cli(f"--src={tmp_path / 'bj'}", f"--dst={tmp_path / 'hf'}", "--to=hf")
    assert result.returncode == 0, result.stderr
    back = references.loaded_cleanly(transformers.BertForPreTraining, tmp_path / "hf")
    references.state_dicts_equal(model, back)
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["do_lower_case"]
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["hidden_act"] == "gelu_new"


def test_fine_tuned_glue_checkpoint_to_hf(tmp_path):
    """The issue's case: ``--to=hf`` on a fine-tuned MRPC checkpoint used to fail."""
    _, path = fine_tuned(get_task("mrpc"), tmp_path / "run")
    result = _run_cli(f"--src={path}", f"--dst={tmp_path / 'hf'}", "--to=hf")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"wrote hf checkpoint to {tmp_path / 'hf'}"
    model = references.loaded_cleanly(transformers.BertForSequenceClassification, tmp_path / "hf")
    assert model.config.id2label == {0: "0", 1: "1"}


def test_cli_errors_are_one_line_and_leave_nothing(small_pretraining, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(small_pretraining[1], src)
    (src / "config.json").write_text(json.dumps({"hidden_size": 32}))
    result = _run_cli(f"--src={src}", f"--dst={tmp_path / 'dst'}", "--to=hf")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith("convert: error: ")
    assert "config.json: missing field(s) ['vocab_size'" in result.stderr
    assert not (tmp_path / "dst").exists()
    (tmp_path / "dst").mkdir()
    result = _run_cli(f"--src={small_pretraining[1]}", f"--dst={tmp_path / 'dst'}", "--to=hf")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"convert: error: {tmp_path / 'dst'}: already exists (pass --overwrite to replace it)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]
