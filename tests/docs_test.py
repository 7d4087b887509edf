"""The README and the docs as a newcomer meets them: the README is short and its test command is
the one CI runs; every relative link in README.md and docs/*.md reaches a file, and every
``#anchor`` a heading of it (GitHub's anchor rule)."""

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "launch/README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*_]", "", heading.strip().lstrip("#").strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: pathlib.Path) -> set[str]:
    return {_anchor(line) for line in path.read_text().splitlines() if line.startswith("#")}


def test_the_readme_is_short_and_its_two_commands_are_what_ci_runs():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    commands = [line.strip() for line in quickstart.splitlines() if line.startswith("    python3")]
    assert len(commands) == 2, commands
    assert "bertjax.main --config=configs/tiny.py" in commands[0]
    ci = (REPO / ".ci/run").read_text().strip().splitlines()[-1]
    assert ci == commands[1]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(path):
    broken = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not ours to check
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading with that anchor")
    assert broken == []


def test_the_anchor_rule():
    assert _anchor("## On Cloud Storage (`gs://`)") == "on-cloud-storage-gs"
    assert _anchor("### NVIDIA H200, 2026-11-26") == "nvidia-h200-2026-11-26"
    assert _anchor("## The XLA:CPU forms pay") == "the-xlacpu-forms-pay"
