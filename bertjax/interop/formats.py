"""Which format a path holds, and reading or writing any of them.

Formats: ``hf`` (a HuggingFace directory, ``bertjax.interop.hf``), ``tf1`` (Google's original
release, ``bertjax.interop.tf1``), ``bertjax`` (a params-only checkpoint) and ``workdir`` (a
training workdir, read only; ``bertjax.interop.native``), each local or on ``gs://``.
:func:`detect_format` tells them apart by their files; :func:`load` reads any into a
:class:`~bertjax.interop.converted.Converted`; :func:`save` writes one as ``bertjax`` or ``hf``;
:func:`convert` does both (what ``python -m bertjax.convert`` runs). Every failure is a
:class:`~bertjax.interop.converted.ConvertError` naming the file, and leaves nothing at the
destination.
"""

from __future__ import annotations

from etils import epath

from bertjax.interop import hf, native, tf1
from bertjax.interop.converted import Converted, ConvertError
from bertjax.training import checkpoint, workdir

SOURCES = ("hf", "tf1", "bertjax", "workdir")
DESTINATIONS = ("bertjax", "hf")


def detect_format(src: str) -> str:
    """'bertjax' | 'workdir' | 'hf' | 'tf1' from the files at ``src``."""
    path = epath.Path(src)
    if epath.Path(src + ".index").exists():
        return "tf1"
    if not src or not path.is_dir():  # epath reads "" as "."
        raise ConvertError(f"{src}: no such checkpoint directory")
    if checkpoint.is_params_checkpoint(src):
        return "bertjax"
    # Before config.json / bert_config.json: a workdir holds both next to its checkpoints.
    if (path / workdir.CHECKPOINTS_DIR).is_dir():
        return "workdir"
    if (path / "config.json").exists():
        return "hf"
    if (path / "bert_config.json").exists():
        return "tf1"
    raise ConvertError(
        f"{src}: not a recognised checkpoint (no {checkpoint.META_FILE}, "
        "checkpoints/, config.json or bert_config.json)"
    )


def load(src: str, fmt: str | None = None, do_lower_case: bool | None = None,
         casing_from_vocab: bool = False) -> Converted:  # fmt: skip
    """Reads any supported checkpoint into memory (``fmt`` None = detect). ``do_lower_case``
    is used where the source does not record its casing (TF1; HF without tokenizer_config);
    where neither does, ``casing_from_vocab`` takes the casing its vocab implies
    (:func:`~bertjax.interop.converted.vocab_casing`), else it is an error."""
    fmt = fmt or detect_format(src)
    if fmt == "hf":
        return hf.read(src, do_lower_case, casing_from_vocab)
    if fmt == "tf1":
        return tf1.read(src, do_lower_case, casing_from_vocab)
    if fmt == "bertjax":
        return native.read_checkpoint(src)
    if fmt == "workdir":
        return native.read_workdir(src)
    raise ConvertError(f"unknown source format {fmt!r}; expected one of {', '.join(SOURCES)}")


def save(dst: str, conv: Converted, to: str, *, overwrite: bool = False) -> str:
    """Writes ``conv`` at ``dst`` as ``to`` ('bertjax' or 'hf'); returns the path written."""
    if to == "hf":
        return hf.write(dst, conv, overwrite=overwrite)
    if to == "bertjax":
        return native.write_checkpoint(dst, conv, overwrite=overwrite)
    raise ConvertError(f"--to={to!r}: expected 'bertjax' or 'hf'")


def convert(src: str, dst: str, to: str, fmt: str | None = None,
            do_lower_case: bool | None = None, overwrite: bool = False) -> str:  # fmt: skip
    """Reads ``src`` and writes it at ``dst`` as ``to``; an existing ``dst`` is an error unless
    ``overwrite`` (checked before anything is read)."""
    if to not in DESTINATIONS:
        raise ConvertError(f"--to={to!r}: expected 'bertjax' or 'hf'")
    if epath.Path(dst).exists() and not overwrite:
        raise ConvertError(f"{dst}: already exists (pass --overwrite to replace it)")
    return save(dst, load(src, fmt, do_lower_case), to, overwrite=overwrite)
