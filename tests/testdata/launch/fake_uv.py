"""A fake ``uv`` on the fake workers: records its argv in ``~/uv.jsonl``; ``uv venv ... DIR``
makes ``DIR/bin/python``, a copy of ``venv-python`` (fake_python.py) next to this file."""

import json
import os
import pathlib
import shutil
import sys

argv = sys.argv[1:]
with open(os.path.join(os.environ["HOME"], "uv.jsonl"), "a") as f:
    f.write(json.dumps(argv) + "\n")
if argv[0] == "venv":
    bin_dir = pathlib.Path(argv[-1], "bin")
    bin_dir.mkdir(parents=True)
    shutil.copy(pathlib.Path(__file__).with_name("venv-python"), bin_dir / "python")
