"""A checkpoint in memory (:class:`Converted`), the error every reader raises, and the checks
every reader makes on the files it is given.

Every reader of ``bertjax.interop`` returns a :class:`Converted` and every writer takes one:
numpy float32 params in bertjax's *unscanned* layout (``encoder/layers/layer_{i}``), the
architecture, the vocab file the embedding rows refer to, its casing, and, for a fine-tuned
model, its task (the ``task`` record of ``bertjax_checkpoint.json``,
``bertjax.training.checkpoint``). Any problem with a source is a :class:`ConvertError` whose
one-line message names the file (and key) at fault.

Paths are local or ``gs://`` (any ``etils.epath`` path: TensorFlow's file systems): every
module of ``bertjax.interop`` checks and reads them through ``epath``, which answers a local path
with ``os`` itself, so local behaviour is the standard library's. A storage client's own error (a
forbidden bucket, retries spent) propagates, and commands print it as one line (``bertjax.cli``).
"""

from __future__ import annotations

import dataclasses
import io
import json

from etils import epath

from bertjax.model.config import BertConfig


class ConvertError(ValueError):
    """A source checkpoint is missing, malformed or does not match its config."""


@dataclasses.dataclass
class Converted:
    """A checkpoint in memory: unscanned numpy params, architecture, vocab, casing and task.

    ``task`` is None for a pretrained model, else ``{"name": str, "head": str, "labels": [str]
    or None}`` with ``head`` one of ``bertjax.finetune.tasks.HEADS``.
    """

    params: dict
    config: BertConfig
    vocab_file: str
    do_lower_case: bool
    task: dict | None = None


def read_lines(path: str) -> list[str]:
    """The lines of a UTF-8 text file, local or ``gs://``, exactly as
    ``open(path, encoding="utf-8").readlines()`` gives them (universal newlines; a decoding
    error is the same UnicodeDecodeError)."""
    return io.TextIOWrapper(io.BytesIO(epath.Path(path).read_bytes()), encoding="utf-8").readlines()


def read_json(path: str) -> dict:
    """A JSON object file; ConvertError naming ``path`` if missing, not UTF-8 JSON or no object."""
    if not epath.Path(path).is_file():
        raise ConvertError(f"{path}: file not found")
    try:
        value = json.loads(epath.Path(path).read_bytes().decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError, json.JSONDecodeError
        raise ConvertError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise ConvertError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def json_bool(values: dict, key: str, default: bool, path: str) -> bool:
    """``values[key]`` as a bool; a string like ``"false"`` is an error, not ``True``."""
    value = values.get(key, default)
    if not isinstance(value, bool):
        raise ConvertError(f"{path}: {key}={value!r:.40}, expected true or false")
    return value


def require_casing(do_lower_case: bool | None, src: str, vocab_file: str | None = None) -> bool:
    """The casing a source did not record comes from the caller (``--do_lower_case``), else
    from ``vocab_file`` when one is given (:func:`vocab_casing`), else it is an error."""
    if do_lower_case is None and vocab_file is not None:
        return vocab_casing(vocab_file)
    if do_lower_case is None:
        raise ConvertError(
            f"{src}: casing unknown (no tokenizer_config.json do_lower_case); pass "
            "--do_lower_case=true|false"
        )
    return bool(do_lower_case)


def vocab_casing(vocab_file: str) -> bool:
    """Whether a WordPiece vocab belongs to a lower-casing ("uncased") model: no entry has an
    upper-case letter outside brackets (``[CLS]``, ``[unused0]``). Google's uncased vocabs have
    none, since their text was lower-cased before the vocab was built; its cased ones hold
    ``The``, ``A``, ... and lower-casing would never produce those."""
    tokens = [line.strip() for line in read_lines(vocab_file)]
    return not any(
        token != token.lower() for token in tokens if not (token[:1] == "[" and token[-1:] == "]")
    )


def token_ids(vocab_file: str) -> dict[str, int]:
    """token -> id of a WordPiece vocab.txt (its lines) or a HF tokenizer.json (its model's vocab
    and added tokens); ConvertError naming the file when it is neither."""
    if str(vocab_file).endswith(".json"):
        from bertjax.training import checkpoint  # noqa: PLC0415 - interop reads training's

        try:
            return checkpoint.tokenizer_json_ids(epath.Path(vocab_file).read_bytes(), vocab_file)
        except checkpoint.CheckpointError as e:
            raise ConvertError(str(e)) from None
    try:
        return {line.rstrip("\n"): i for i, line in enumerate(read_lines(vocab_file))}
    except UnicodeDecodeError as e:
        message = f"{vocab_file}: vocab file not UTF-8 ({e.reason} at byte {e.start})"
        raise ConvertError(message) from None


def check_vocab(vocab_file: str, cfg: BertConfig, weights: str, key: str) -> None:
    """The vocab must have one entry per row of the word embedding ``weights``/``key``: a line of
    a vocab.txt, an id of a tokenizer.json."""
    if not epath.Path(vocab_file).exists():
        raise ConvertError(f"{vocab_file}: vocab file not found")
    if str(vocab_file).endswith(".json"):
        n = len(set(token_ids(vocab_file).values()))
    else:
        try:
            n = len(read_lines(vocab_file))
        except UnicodeDecodeError as e:
            message = f"{vocab_file}: vocab file not UTF-8 ({e.reason} at byte {e.start})"
            raise ConvertError(message) from None
    if n != cfg.vocab_size:
        raise ConvertError(
            f"{vocab_file}: {n} tokens, but {weights} key {key!r} has {cfg.vocab_size} rows"
        )
