"""What a finished run produced, as the JSON-ready dict its results file stores.

Each reader takes what bertjax itself wrote, nothing recomputed:

- pretraining: the ``eval step N key value ...`` lines and the ``final summary: {...}`` line of
  the run's log (``bertjax.training.loop``; the log collects every attempt of a resumed run, so
  a step evaluated twice keeps its last line);
- a sweep: ``sweep_results.json`` (``bertjax.finetune.sweep``: one row per learning rate and
  seed, each with its dev metrics), kept whole, the report computes means and spreads from it;
- the feature-based runs: ``feature_based_results.json``, kept whole;
- a vocab: its number of entries.
"""

from __future__ import annotations

import json
import os
import re

_EVAL = re.compile(r"^eval step (\d+) (.*)$")
_SUMMARY = "final summary: "


class OutcomeError(ValueError):
    """A run exited 0 but its outputs are not there; one line naming the file."""


def eval_curve(log_text: str) -> dict[str, dict[str, float]]:
    """{step (as a string, JSON's keys): {metric: value}} from a pretraining log."""
    curve: dict[str, dict[str, float]] = {}
    for line in log_text.splitlines():
        match = _EVAL.match(line.strip())
        if match:
            words = match.group(2).split()
            curve[match.group(1)] = {
                k: float(v) for k, v in zip(words[::2], words[1::2], strict=True)
            }
    return dict(sorted(curve.items(), key=lambda kv: int(kv[0])))


def final_summary(log_text: str) -> dict:
    lines = [ln for ln in log_text.splitlines() if ln.startswith(_SUMMARY)]
    return json.loads(lines[-1][len(_SUMMARY) :]) if lines else {}


def _json(path: str) -> dict:
    if not os.path.exists(path):
        raise OutcomeError(f"{path}: missing, though the run exited 0")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read(kind: str, workdir: str, log_path: str, vocab_file: str = "") -> dict:
    """The results of a finished run of ``kind`` (``bench.paper.plan.KINDS``)."""
    if kind == "pretrain":
        with open(log_path, encoding="utf-8") as f:
            text = f.read()
        curve = eval_curve(text)
        if not curve:
            raise OutcomeError(f"{log_path}: no 'eval step' line, though the run exited 0")
        return {"eval_curve": curve, "final_summary": final_summary(text)}
    if kind in ("finetune", "bilstm"):
        return {"sweep": _json(os.path.join(workdir, "sweep_results.json"))}
    if kind == "feature_based":
        return {"feature_based": _json(os.path.join(workdir, "feature_based_results.json"))}
    if kind == "vocab":
        with open(vocab_file, encoding="utf-8") as f:
            return {"entries": sum(1 for line in f if line.strip())}
    raise OutcomeError(f"no outcome reader for run kind {kind!r}")
