"""What a finished run produced, as the JSON-ready dict its results file stores.

Each reader takes what bertjax itself wrote, nothing recomputed:

- pretraining: the ``eval step N key value ...`` lines and the ``final summary: {...}`` line of
  the run's log (``bertjax.training.loop``; the log collects every attempt of a resumed run, so
  a step evaluated twice keeps its last line);
- a sweep: ``sweep_results.json`` (``bertjax.finetune.sweep``: one row per learning rate and
  seed, each with its dev metrics), kept whole, the report computes means and spreads from it;
- the feature-based runs: ``feature_based_results.json``, kept whole;
- a vocab: its number of entries and its sha256.

:func:`differs` says whether a rerun of a finished run (``bench.paper.run``: its output lost)
produced what its record holds: the same vocab bytes, the same held-out curve of a pretraining
(every step's every metric, as printed), the same subset counts, the same snapshot step. On the
same machine a rerun is bit-identical. On another CPU, XLA:CPU's float32 sums come in another
order and a pretraining's curve drifts (``pretrain/bert``, 4,000 steps: held-out MLM accuracy
12.57% on an AMD EPYC against 12.5% on a Xeon, NSP 74.6% against 75.8% on 256 sequences);
:func:`beyond_tolerance` is the check there (:func:`verdict` chooses): every accuracy within
``ACCURACY_TOLERANCE``
(absolute; NSP's, one answer per evaluated sequence, within 3 standard errors of a proportion
when that is wider: about 8 points at 70% on 256 sequences, where one run's own curve moves by
5 from one evaluation to the next), every other metric within ``RELATIVE_TOLERANCE`` of its
recorded value.
"""

from __future__ import annotations

import hashlib
import json
import math
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
            entries = sum(1 for line in f if line.strip())
        return {"entries": entries, "sha256": sha256(vocab_file)}
    raise OutcomeError(f"no outcome reader for run kind {kind!r}")


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


_COMPARED = {  # kind -> the results key a rerun must reproduce
    "vocab": "sha256",
    "subset": "examples",
    "pretrain": "eval_curve",
    "snapshot": "step",
}


def differs(kind: str, recorded: dict, rerun: dict) -> str:
    """'' when ``rerun`` reproduces ``recorded`` (both ``read``'s dicts), else one line saying
    where they first differ."""
    key = _COMPARED.get(kind)
    if key is None or key not in recorded:
        return ""  # nothing recorded to hold it to (an older vocab record: entries only)
    old, new = recorded[key], rerun.get(key)
    if old == new:
        return ""
    if isinstance(old, dict) and isinstance(new, dict):
        for name in sorted(set(old) | set(new), key=lambda k: (not k.isdigit(), k.zfill(12))):
            if old.get(name) != new.get(name):
                return f"{key} {name}: recorded {old.get(name)}, now {new.get(name)}"
    return f"{key}: recorded {old}, now {new}"


ACCURACY_TOLERANCE = 0.02  # absolute, on a 0-1 accuracy: 2 points
RELATIVE_TOLERANCE = 0.02  # of a loss or any other metric


def beyond_tolerance(kind: str, recorded: dict, rerun: dict) -> str:
    """'' when a pretraining rerun on another machine stays within the tolerances of its
    recorded curve, else one line naming the first metric beyond them; for every other kind
    (exact by nature) the same as :func:`differs`."""
    if kind != "pretrain" or "eval_curve" not in recorded:
        return differs(kind, recorded, rerun)
    old, new = recorded["eval_curve"], rerun.get("eval_curve", {})
    if sorted(old) != sorted(new):
        return f"eval_curve steps: recorded {sorted(old, key=int)}, now {sorted(new, key=int)}"
    for step in sorted(old, key=int):
        for metric, value in old[step].items():
            got = new[step].get(metric)
            if got is None:
                return f"eval_curve {step} {metric}: recorded {value}, now missing"
            limit = RELATIVE_TOLERANCE * abs(value)
            if "accuracy" in metric:
                limit = ACCURACY_TOLERANCE
            if metric == "nsp_accuracy" and old[step].get("sequences"):
                # one answer per sequence: 3 standard errors of a proportion over them
                sequences = old[step]["sequences"]
                limit = max(limit, 3 * math.sqrt(value * (1 - value) / sequences))
            if abs(got - value) > limit:
                return f"eval_curve {step} {metric}: recorded {value}, now {got} (limit {limit:g})"
    return ""


def verdict(kind: str, record: dict, rerun: dict, machine: str) -> tuple[str, str]:
    """How a rerun on ``machine`` of a finished run compares with its ``record`` (the run's whole
    record: its ``results`` and the ``machine`` that made them): ``("equal", "")``;
    ``("tolerated", how it differs)`` on another machine within :func:`beyond_tolerance`; or
    ``("differs", where)``, where names the first difference (beyond the tolerances, on
    another machine)."""
    differ = differs(kind, record["results"], rerun)
    if not differ:
        return "equal", ""
    if machine == record.get("machine"):
        return "differs", differ
    beyond = beyond_tolerance(kind, record["results"], rerun)
    if beyond:
        return "differs", f"{beyond}, on another machine"
    return "tolerated", differ
