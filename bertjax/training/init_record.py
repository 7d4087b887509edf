"""What a training workdir records of its run's init checkpoint, so that a resume never reads it.

A run from ``config.init_checkpoint`` (continued pretraining, ``bertjax.pretrain.continued``;
fine-tuning, ``bertjax.finetune.inputs``) reads the checkpoint's architecture, vocab, casing and
params at its first start. Its workdir's record (``bertjax.training.workdir``; the layout is
``bertjax.training.checkpoint``'s docstring) keeps what a resume needs: the architecture in
``bert_config.json``, the vocab in ``vocab.txt``, the casing in ``bertjax_workdir.json``'s
``do_lower_case``, and there, in ``"init"`` (:class:`InitRecord`), where the params came from::

    "init": {"source": "gs://bucket/bert_base", "format": "hf",
             "params_sha256": "<hex>", "subtrees": ["encoder", "pooler"], "fresh": ["mlm", "nsp"]}

``subtrees`` are the checkpoint's top-level subtrees the run took (continued pretraining: those
of ``encoder, pooler, mlm, nsp`` it has; fine-tuning: all of them), ``params_sha256`` their
:func:`params_fingerprint`, ``fresh`` the subtrees the run drew itself (heads the checkpoint
lacks). ``"init": null``: the run started from a fresh init.

**A resume** (:func:`resumed`: the workdir holds a record of format 3 with an ``"init"``) takes
the architecture, vocab and casing from the record, never from the checkpoint. The checkpoint's
params are needed only when no step restores (the run stopped before its first sealed save):
then, and only then, :func:`reread` reads ``config.init_checkpoint`` (the recorded ``source``
when it is empty), and its params must be the recorded ones by fingerprint; a checkpoint that
is missing or holds other params is one line naming it. A ``config.init_checkpoint`` other than
the recorded ``source`` is a notice, not an error: the record wins, and the path given is only
where to find the same params if they are needed (a checkpoint may move; its params may not
change). When a step restores, one line says the init checkpoint was not read
(:func:`not_read_line`, printed by ``bertjax.training.start``).

A record of format 2 (before this one: no ``"init"``) resumes as it always did, reading the init
checkpoint, and the run rewrites it as format 3. A format-3 run from a fresh init refuses a
``config.init_checkpoint`` (:func:`resumed`): that would be another run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable, Mapping

import numpy as np

from bertjax.training.checkpoint import CheckpointError

INIT_KEY = "init"  # in bertjax_workdir.json
_SHA256 = re.compile(r"[0-9a-f]{64}")


def params_fingerprint(params: Mapping) -> str:
    """sha256 (hex) of a params tree (nested dicts of arrays, the unscanned layout): for every
    leaf in sorted key-path order, ``"<path>\\0<dtype name>\\0<shape>\\0"`` and then the array's
    bytes in C order. Independent of dict order and of where the arrays live."""
    digest = hashlib.sha256()
    for path, value in _leaves(params, ""):
        array = np.asarray(value)  # (ascontiguousarray would make a 0-d array 1-d)
        digest.update(f"{path}\0{array.dtype.name}\0{array.shape}\0".encode())
        digest.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
    return digest.hexdigest()


def _leaves(tree: Mapping, prefix: str):
    for key in sorted(tree):
        value = tree[key]
        if isinstance(value, Mapping):
            yield from _leaves(value, f"{prefix}{key}/")
        else:
            yield f"{prefix}{key}", value


@dataclasses.dataclass(frozen=True)
class InitRecord:
    """The ``"init"`` entry of ``bertjax_workdir.json`` (module docstring)."""

    source: str  # config.init_checkpoint at the first start
    format: str  # bertjax.interop.formats.SOURCES
    params_sha256: str  # params_fingerprint of `subtrees`
    subtrees: tuple[str, ...]  # the checkpoint's top-level subtrees the run took
    fresh: tuple[str, ...] = ()  # the subtrees the run initialised itself

    @classmethod
    def of(cls, source: str, fmt: str, params: Mapping, fresh=()) -> InitRecord:
        """The record of a first start that took ``params`` (unscanned) from ``source``."""
        return cls(str(source), fmt, params_fingerprint(params), tuple(sorted(params)),
                   tuple(sorted(fresh)))  # fmt: skip

    def to_json(self) -> dict:
        return {
            "source": self.source,
            "format": self.format,
            "params_sha256": self.params_sha256,
            "subtrees": list(self.subtrees),
            "fresh": list(self.fresh),
        }

    @classmethod
    def from_json(cls, value, path) -> InitRecord | None:
        """The entry read from ``path``; CheckpointError (one line naming ``path``) if it is not
        null or an object of the module docstring's fields."""
        if value is None:
            return None
        names = lambda x: isinstance(x, list) and all(isinstance(n, str) for n in x)  # noqa: E731
        valid = (
            isinstance(value, dict)
            and set(value) == {"source", "format", "params_sha256", "subtrees", "fresh"}
            and isinstance(value["source"], str)
            and value["source"]
            and isinstance(value["format"], str)
            and isinstance(value["params_sha256"], str)
            and _SHA256.fullmatch(value["params_sha256"])
            and names(value["subtrees"])
            and names(value["fresh"])
        )
        if not valid:
            raise CheckpointError(
                f'{path}: {INIT_KEY}={value!r:.80}, expected null or {{"source", "format", '
                '"params_sha256" (64 hex digits), "subtrees" and "fresh" (lists of names)}'
            )
        return cls(value["source"], value["format"], value["params_sha256"],
                   tuple(value["subtrees"]), tuple(value["fresh"]))  # fmt: skip


def resumed(record: dict | None, init_checkpoint: str, workdir) -> InitRecord | None:
    """The init record a start resumes from (``record``: ``workdir.read_record``'s), or None: no
    record (a first start), a format-2 record (it reads its init checkpoint as before), or a run
    from a fresh init with no ``init_checkpoint``. Raises CheckpointError for a fresh-init run
    given an ``init_checkpoint``; prints the notice of the module docstring when the one given
    is not the recorded one."""
    if record is None or record["format_version"] < 3:
        return None
    init = record[INIT_KEY]
    if init is None:
        if init_checkpoint:
            raise CheckpointError(
                f"{workdir} holds a run that started from a fresh init (its record names no "
                f"init checkpoint); config.init_checkpoint={init_checkpoint} would start another "
                "run: drop it to resume, or use a new workdir (nothing was changed)"
            )
        return None
    if init_checkpoint and str(init_checkpoint) != init.source:
        print(
            f"config.init_checkpoint={init_checkpoint}: {workdir} records {init.source} as its "
            "run's init checkpoint, and the record wins (architecture, vocab, casing); "
            f"{init_checkpoint} is read only if no step restores, and must hold the same params "
            f"(sha256 {init.params_sha256[:16]}...)",
            flush=True,
        )
    return init


def reread(init: InitRecord, init_checkpoint: str, workdir, read: Callable[[str], Mapping]):
    """The recorded subtrees of the init checkpoint, read again because no step of ``workdir``
    restores: from ``init_checkpoint``, else the recorded source. ``read(path)`` -> its params
    (unscanned; any ValueError it raises means it cannot be read). Raises CheckpointError (one
    line naming the checkpoint) when it cannot be read or holds other params."""
    source = str(init_checkpoint or init.source)
    try:
        params = read(source)
    except ValueError as e:
        reason = (str(e).splitlines() or [""])[0]
        raise CheckpointError(
            f"{reason}; {workdir} holds no verified step, so its run starts again from its init "
            f"checkpoint (recorded: {init.source}): put it back, or pass where it is now with "
            "--config.init_checkpoint"
        ) from None
    missing = [name for name in init.subtrees if name not in params]
    taken = {name: params[name] for name in init.subtrees if not missing}
    found = params_fingerprint(taken) if not missing else ""
    if found != init.params_sha256:
        here = f"sha256 {found[:16]}..." if found else f"no {', '.join(missing)}"
        raise CheckpointError(
            f"{source}: not the params {workdir}'s run started from (its record: {init.source}, "
            f"{', '.join(init.subtrees)} with sha256 {init.params_sha256[:16]}...; here: "
            f"{here}): pass that checkpoint, or use a new workdir (nothing was changed)"
        )
    print(
        f"init_checkpoint {source}: read, as {workdir} holds no verified step; its params are "
        f"the recorded ones (sha256 {found[:16]}...)",
        flush=True,
    )
    return taken


def not_read_line(init: InitRecord, workdir, step: int) -> str:
    """The line a resume prints when a step restored (``bertjax.training.start``)."""
    return (
        f"init_checkpoint {init.source}: not read (step {step} restored; {workdir}'s record "
        "holds the architecture, vocab and casing)"
    )
