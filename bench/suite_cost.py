"""What each test costs in CPU seconds, and where the suite's time goes: a pytest plugin and its
report (issue #37 item 7: the suite's 12-minute budget on 2 cores).

    SUITE_COST_OUT=/tmp/cost.jsonl python -m pytest -n 2 -p bench.suite_cost tests
    python -m bench.suite_cost /tmp/cost.jsonl [--top=40]

The plugin appends one JSON line per test to ``SUITE_COST_OUT``: its node id, the xdist worker,
wall seconds, and CPU seconds (user + system) of the test's process and of the child processes
it started and waited for (``resource.getrusage``), setup and teardown included, so a module
fixture is charged to the first test that builds it. CPU seconds are what to compare on a shared
machine: wall time grows with the load, CPU time much less (on a 2-core VM, 0.83x of the CPU a
run beside load average 8 took). Children that outlive their test (a server a fixture keeps) are
counted only where they are waited for; the commands the suite forks from its zygote
(``tests/zygote.py``) when they end.

The report sums CPU by file, biggest first, with the share of the suite's CPU, and the suite's
wall time per worker.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
import time

import pytest

OUT = "SUITE_COST_OUT"


def _cpu() -> tuple[float, float]:
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                           resource.RUSAGE_CHILDREN))  # fmt: skip
    # Commands forked from the suite's zygote (tests/zygote.py) are its children, not ours.
    zygote = sys.modules.get("tests.zygote")
    forked = zygote.forked_cpu() if zygote is not None else 0.0
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime + forked


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    own0, children0, wall0 = *_cpu(), time.time()
    yield
    own1, children1, wall1 = *_cpu(), time.time()
    with open(os.environ.get(OUT, "suite_cost.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps({
            "id": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
            "self": own1 - own0, "children": children1 - children0, "wall": wall1 - wall0,
        }) + "\n")  # fmt: skip


def report(path: str, top: int = 40) -> str:
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    total = sum(r["self"] + r["children"] for r in rows)
    by_file = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        entry = by_file[r["id"].split("::")[0]]
        entry[0] += r["self"]
        entry[1] += r["children"]
        entry[2] += 1
    walls = collections.Counter()
    for r in rows:
        walls[r["worker"] or "main"] += r["wall"]
    lines = [f"{len(rows)} tests, {total:.0f} CPU s ({sum(r['self'] for r in rows):.0f} in the "
             f"test processes, {sum(r['children'] for r in rows):.0f} in processes they "
             f"started); wall per worker: "
             + ", ".join(f"{w} {s:.0f} s" for w, s in sorted(walls.items())),
             "", "| CPU s | share | in tests | in children | tests | file |",
             "| ---: | ---: | ---: | ---: | ---: | --- |"]  # fmt: skip
    ranked = sorted(by_file.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
    for name, (own, children, count) in ranked[:top]:
        lines.append(f"| {own + children:.0f} | {(own + children) / total:.1%} | {own:.0f} | "
                     f"{children:.0f} | {count} | `{name}` |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--top=")]
    top = [int(a.split("=", 1)[1]) for a in argv if a.startswith("--top=")] or [40]
    if len(args) != 1 or not os.path.isfile(args[0]):
        what = " ".join(args) or "no file"
        print(f"suite_cost: {what}: expected one COST.jsonl the plugin wrote "
              "(python -m bench.suite_cost COST.jsonl [--top=N])", file=sys.stderr)  # fmt: skip
        return 2
    print(report(args[0], top[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
