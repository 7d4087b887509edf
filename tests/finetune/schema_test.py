"""Fine-tuning's config schema (``bertjax.finetune.schema``): pretraining's sections and names for
the same things; every key of the old flat schema is one line naming its new key, on the command
line and in a config file, with no alias that would still take it."""

import importlib.util
import pathlib
import subprocess
import sys

import pytest

from bertjax.finetune import schema

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _config(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def _keys(config, prefix="") -> set[str]:
    found = set()
    for key, value in config.items():
        if hasattr(value, "items"):
            found |= _keys(value, f"{prefix}{key}.")
        else:
            found.add(f"{prefix}{key}")
    return found


def test_sections_and_names_are_pretrainings():
    finetune, pretrain = _keys(_config("finetune_base")), _keys(_config("base"))
    sections = {key.split(".")[0] for key in finetune if "." in key}
    assert sections == {
        "task",
        "model",
        "data",
        "train",
        "optimizer",
        "checkpoint",
        "mesh",
        "sweep",
        "feature_based",  # the feature-based trainer's own keys (Table 7), like sweep's
    }
    own_sections = ("task", "sweep", "feature_based")
    shared = {k for k in finetune if k.split(".")[0] not in own_sections}
    # What both schemas have is named alike; what only fine-tuning has is few and listed: the
    # BiLSTM between encoder and task head is a fine-tuning model's (Table 5's "+ BiLSTM").
    own = shared - pretrain
    assert own == {
        "mode",
        "train.num_epochs",
        "optimizer.warmup_proportion",
        "model.head_rnn",
        "model.head_rnn_size",
        "model.head_rnn_layers",
    }, own
    for old, new in schema.RENAMED.items():
        assert new in finetune, (old, new)
        assert old not in finetune, f"{old}: still a key (an alias)"


def test_the_task_configs_set_only_keys_of_the_schema():
    base = _keys(_config("finetune_base"))
    for name in ("finetune_glue", "finetune_ner", "finetune_swag", "finetune_feature_based"):
        assert _keys(_config(name)) == base, name
    ner = _config("finetune_ner")
    assert (ner.task.name, ner.data.do_lower_case, ner.optimizer.learning_rate) == (
        "conll2003",
        False,
        5e-5,
    )


def _finetune(tmp_path, *args):
    return subprocess.run(
        [sys.executable, "-m", "bertjax.finetune", f"--workdir={tmp_path}/out", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip


def test_an_old_key_is_one_line_naming_its_new_key(tmp_path):
    """On the command line, in a config file that calls get_config with the old keyword, and in
    one that sets an old key on the (locked) config; one process each, all before any import of
    JAX or TensorFlow."""
    old_call = tmp_path / "old_call.py"
    old_call.write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT / 'configs')!r})\nimport finetune_base\n\n\n"
        "def get_config():\n    return finetune_base.get_config(batch_size=16)\n"
    )
    old_set = tmp_path / "old_set.py"
    old_set.write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT / 'configs')!r})\nimport finetune_base\n\n\n"
        "def get_config():\n    config = finetune_base.get_config()\n"
        "    config.num_train_epochs = 2.0\n    return config\n"
    )
    cases = [
        (("--config=configs/finetune_glue.py", "--config.batch_size=8"),
         "--config.batch_size is --config.train.global_batch_size now"),
        (("--config=configs/finetune_glue.py", "--config.task=mrpc"),
         "--config.task is --config.task.name now"),
        ((f"--config={old_call}",), "batch_size is config.train.global_batch_size now"),
        ((f"--config={old_set}",), "num_train_epochs is config.train.num_epochs now"),
    ]  # fmt: skip
    for args, expected in cases:
        result = _finetune(tmp_path, *args)
        assert result.returncode == 1, result.stderr[-2000:]
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("finetune: error: "), result.stderr
        assert expected in lines[0], lines[0]


@pytest.mark.parametrize("message,expected", [
    ("get_config() got an unexpected keyword argument 'learning_rate'",
     "config.learning_rate is config.optimizer.learning_rate now"),
    ('Key "data_dir" does not exist and cannot be added since the config is locked.',
     "config.data_dir is config.task.data_dir now"),
    ("some other error 'seed'", None),
])  # fmt: skip
def test_a_config_files_error_names_the_new_key_of_the_old_one_it_quotes(message, expected):
    moved = schema.moved(message)
    assert moved is None if expected is None else moved.startswith(expected)
