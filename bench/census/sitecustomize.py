"""The process census's hook (``bench/process_census.py``): with this folder on ``PYTHONPATH``
and ``PROCESS_CENSUS_OUT`` set, every Python process appends one JSON line there when it exits:
its argv, its own CPU seconds (user + system) and wall seconds, and the test that was running
when its environment was made (``PYTEST_CURRENT_TEST``). A process killed by a signal writes
nothing. Without ``PROCESS_CENSUS_OUT`` it does nothing."""

import atexit
import json
import os
import resource
import sys
import time

_OUT = os.environ.get("PROCESS_CENSUS_OUT")
_STARTED = time.time()


def _record() -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    line = {
        "pid": os.getpid(),
        "argv": sys.argv[:3],
        "cpu": usage.ru_utime + usage.ru_stime,
        "wall": time.time() - _STARTED,
        "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
    }
    try:
        with open(_OUT, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
    except OSError:
        pass


if _OUT:
    atexit.register(_record)
