"""bench/process_census.py: the hook logs a process at exit only when asked, and the report
groups the processes by command, leaving out pytest-xdist's workers."""

import json
import os
import subprocess
import sys

from bench import process_census

HOOK = os.path.join(os.path.dirname(process_census.__file__), "census")


def test_the_hook_logs_a_process_at_exit_only_when_asked(tmp_path):
    out = tmp_path / "procs.jsonl"
    env = {**os.environ, "PYTHONPATH": HOOK}
    code = "import sys; sum(range(10**6))"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert not out.exists()  # PROCESS_CENSUS_OUT unset: nothing
    env["PROCESS_CENSUS_OUT"] = str(out)
    env["PYTEST_CURRENT_TEST"] = "tests/x_test.py::test_y (call)"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    (line,) = out.read_text().splitlines()
    record = json.loads(line)
    assert record["argv"] == ["-c"] and record["test"].startswith("tests/x_test.py::test_y")
    assert record["cpu"] > 0 and record["wall"] >= 0


def test_the_report_groups_by_command_without_the_workers(tmp_path):
    rows = [
        {"argv": ["-c"], "cpu": 200.0, "test": ""},  # an xdist worker
        {"argv": ["/r/bertjax/main.py", "--config=c"], "cpu": 9.0, "test": "t"},
        {"argv": ["/r/bertjax/main.py", "--config=c"], "cpu": 11.0, "test": "t"},
        {"argv": ["/r/bertjax/finetune/__main__.py"], "cpu": 3.0, "test": "t"},
        {"argv": ["-c"], "cpu": 1.0, "test": "t"},  # a helper script a test started
    ]
    path = tmp_path / "procs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = process_census.report(str(path))
    assert text.splitlines()[0] == "4 processes, 24 CPU s"
    assert "| `bertjax.main` | 2 | 20.0 | 10.0 |" in text
    assert "| `bertjax.finetune` | 1 | 3.0 | 3.0 |" in text and "| `-c` | 1 | 1.0 | 1.0 |" in text
