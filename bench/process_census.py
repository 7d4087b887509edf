"""Where the suite's processes spend their CPU: a census of every Python process a run starts
(issue #37 item 7: the suite's 12-minute budget on 2 cores).

    PYTHONPATH=bench/census PROCESS_CENSUS_OUT=/tmp/procs.jsonl python -m pytest -n 3 tests
    python -m bench.process_census /tmp/procs.jsonl

``bench/census/sitecustomize.py`` logs each process as it exits (killed processes, and those
whose environment drops ``PYTHONPATH``, are not counted); this groups them by command, with the
count, the total and the median CPU seconds. The pytest workers themselves are left out.
"""

from __future__ import annotations

import collections
import json
import statistics
import sys


def command_of(argv: list[str]) -> str:
    """'bertjax.main' for [.../bertjax/main.py, ...]; the script's name otherwise."""
    if not argv:
        return "?"
    script = argv[0].replace("\\", "/")
    if "/bertjax/" in script:
        module = script.split("/bertjax/", 1)[1].removesuffix(".py").replace("/", ".")
        return "bertjax." + module.removesuffix(".__main__")
    return script.rsplit("/", 1)[-1]


def report(path: str) -> str:
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    # pytest-xdist's workers: ``python -c`` started outside any test
    rows = [r for r in rows if not (r["argv"] == ["-c"] and not r["test"])]
    by = collections.defaultdict(list)
    for r in rows:
        by[command_of(r["argv"])].append(r["cpu"])
    lines = [
        f"{len(rows)} processes, {sum(r['cpu'] for r in rows):.0f} CPU s",
        "",
        "| command | processes | CPU s | median CPU s |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, cpus in sorted(by.items(), key=lambda kv: -sum(kv[1])):
        total, median = sum(cpus), statistics.median(cpus)
        lines.append(f"| `{name}` | {len(cpus)} | {total:.1f} | {median:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m bench.process_census CENSUS.jsonl")
    print(report(sys.argv[1]))
