"""Every command answers ``--help`` without importing TensorFlow (at once), and every console
script of setup.cfg points at a command's ``main``."""

import configparser
import importlib
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).parents[2]
COMMANDS = ("main", "finetune", "compile", "convert", "extract_features", "tokenize", "vocab",
            "create_pretraining_data", "data_stats")  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS)
def test_help_needs_no_tensorflow(command):
    probe = (
        "import runpy, sys; sys.argv = ['x', '--help']\n"
        f"try:\n    runpy.run_module('bertjax.{command}', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print('TENSORFLOW' if 'tensorflow' in sys.modules else 'NO TENSORFLOW', file=sys.stderr)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            cwd=REPO, timeout=120)  # fmt: skip
    assert "--" in result.stdout + result.stderr, result.stderr[-2000:]  # a flag list
    assert result.stderr.strip().endswith("NO TENSORFLOW"), result.stderr[-2000:]


def test_console_scripts_are_the_commands():
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    scripts = [line.split("=") for line in parser["options.entry_points"]["console_scripts"]
               .strip().splitlines()]  # fmt: skip
    targets = {name.strip(): target.strip() for name, target in scripts}
    assert len(targets) == len(COMMANDS)
    for name, target in targets.items():
        module, function = target.split(":")
        assert function == "main" and callable(importlib.import_module(module).main)
        assert name.startswith("bertjax-")
