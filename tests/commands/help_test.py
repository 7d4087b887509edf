"""Every command answers ``--help`` with its own flags without importing TensorFlow (so at once),
and every console script of setup.cfg is the command it is named for.

The nine ``--help`` runs share one process (a start-up each cost ~10 s of imports): absl's flags
are reset between them, and each answer must list the command's own flags, so a module run under
another's name would show."""

import configparser
import importlib
import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).parents[2]
# command module -> (its console script, flags only its --help lists)
COMMANDS = {
    "main": ("bertjax-pretrain", ("--workdir", "--coordinator_address")),
    "finetune": ("bertjax-finetune", ("--workdir", "--config")),
    "compile": ("bertjax-compile", ("--topology", "--json")),
    "convert": ("bertjax-convert", ("--src", "--dst", "--to")),
    "extract_features": ("bertjax-extract-features", ("--layers", "--checkpoint")),
    "tokenize": ("bertjax-tokenize", ("--vocab_file", "--do_lower_case")),
    "vocab": ("bertjax-vocab", ("--vocab_size", "--runner")),
    "create_pretraining_data": ("bertjax-create-pretraining-data", ("--dupe_factor", "--runner")),
    "data_stats": ("bertjax-data-stats", ("--input_file",)),
}

PROBE = """
import contextlib, io, json, runpy, sys
from absl import app, flags
app.define_help_flags()  # absl defines them once, at the first app.run: keep them
baseline = set(flags.FLAGS)
answers = {}
for command in sys.argv[1:]:
    for name in set(flags.FLAGS) - baseline:  # the last command's flags
        delattr(flags.FLAGS, name)
    flags.FLAGS.unparse_flags()
    sys.argv = [command, "--help"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            runpy.run_module(f"bertjax.{command}", run_name="__main__")
        except SystemExit:
            pass
    answers[command] = {"help": out.getvalue(), "tensorflow": "tensorflow" in sys.modules}
print(json.dumps(answers))
"""


def test_help_lists_each_commands_own_flags_and_needs_no_tensorflow():
    result = subprocess.run([sys.executable, "-c", PROBE, *COMMANDS], capture_output=True,
                            text=True, cwd=REPO, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    answers = json.loads(result.stdout.strip().splitlines()[-1])
    assert list(answers) == list(COMMANDS)
    for command, (_, own) in COMMANDS.items():
        text = answers[command]["help"]
        listed = [flag in text or flag.replace("--", "--[no]") in text for flag in own]  # --[no]x
        assert all(listed), (command, text[-2000:])
        assert not answers[command]["tensorflow"], f"--help of {command} imported TensorFlow"
    # The flags of one command do not leak into the next one's answer.
    assert "--topology" not in answers["convert"]["help"]


def test_console_scripts_are_the_commands_they_are_named_for():
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    scripts = [line.split("=") for line in parser["options.entry_points"]["console_scripts"]
               .strip().splitlines()]  # fmt: skip
    targets = {name.strip(): target.strip() for name, target in scripts}
    expected = {
        script: f"bertjax.{command}{'.__main__' if command == 'finetune' else ''}:main"
        for command, (script, _) in COMMANDS.items()
    }
    assert targets == expected
    for target in targets.values():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function))
