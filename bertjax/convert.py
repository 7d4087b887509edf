"""Checkpoint interop: HuggingFace and Google's original TF1 BERT checkpoints <-> bertjax.

    python -m bertjax.convert --src=PATH --dst=DIR --to=bertjax|hf [--from=hf|tf1|bertjax|workdir]
        [--do_lower_case=true|false] [--overwrite]

Sources (detected from the files when ``--from`` is absent):

* ``hf``: a HuggingFace BERT directory: ``config.json``, ``model.safetensors`` (or
  ``pytorch_model.bin``, or a sharded ``*.index.json``), ``vocab.txt``, optionally
  ``tokenizer_config.json`` (its ``do_lower_case`` wins over the flag). ``BertModel`` or
  ``BertForPreTraining`` key names, with or without the ``bert.`` prefix, old ``gamma``/``beta``
  LayerNorm names too. HF's ``hidden_act: gelu`` is exact erf (our ``gelu``); ``gelu_new`` and
  ``gelu_pytorch_tanh`` are our ``gelu_tanh``. Tolerated and dropped: the ``position_ids`` buffer,
  and the MLM decoder weight/bias when they equal the tied embedding / output bias.
  ``is_decoder: true`` (HF's causally masked BertModel) is our ``attention='causal'``.
* ``tf1``: Google's original release: ``bert_config.json``, ``bert_model.ckpt.{index,data-*}``
  (or any single ``*.ckpt*.index``; ``--src`` may also be the checkpoint prefix), ``vocab.txt``.
  The original code's ``hidden_act: gelu`` is the *tanh* approximation (our ``gelu_tanh``). Only
  the optimizer slots ``*/adam_m``, ``*/adam_v`` and ``global_step`` are ignored.
* ``bertjax``: a params-only checkpoint (``bertjax.training.checkpoint`` layout).
* ``workdir``: a training workdir (``WORKDIR/checkpoints/`` exists): its latest checkpoint.

Any other weight name, a missing weight, a shape that disagrees with the config, or a vocab whose
size differs from the embedding's rows is a :class:`ConvertError` naming the file and key.

HF export writes ``BertForPreTraining`` when the params have the pooler, MLM and NSP heads and
``BertModel`` when they have the pooler only (encoder-only params are also written as
``BertModel``; load those with ``add_pooling_layer=False``), as float32 safetensors, with every
architecture field in ``config.json``, ``vocab.txt`` and ``tokenizer_config.json``. Output
directories are written under a temporary name and renamed into place.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import uuid

import numpy as np
from absl import flags
from safetensors import SafetensorError

from bertjax import cli
from bertjax.model.config import BertConfig
from bertjax.training import checkpoint, checkpoint_manifest, workdir


class ConvertError(ValueError):
    """A source checkpoint is missing, malformed or does not match its config."""


@dataclasses.dataclass
class Converted:
    """A checkpoint in memory: unscanned numpy params, architecture, vocab and casing."""

    params: dict
    config: BertConfig
    vocab_file: str
    do_lower_case: bool


# HF's activation names -> ours (and back). HF's "gelu" is the exact erf form.
_HF_ACT = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}
_HF_ACT_OUT = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
# The original TF code's "gelu" is the tanh approximation.
_TF1_ACT = {"gelu": "gelu_tanh", "relu": "relu"}
_OPTIMIZER_SLOTS = ("/adam_m", "/adam_v")
# (HF / original config.json field, BertConfig field, default when absent; None = required).
_CONFIG_FIELDS = (
    ("vocab_size", "vocab_size", None),
    ("hidden_size", "hidden_size", None),
    ("num_hidden_layers", "num_layers", None),
    ("num_attention_heads", "num_heads", None),
    ("intermediate_size", "intermediate_size", None),
    ("max_position_embeddings", "max_position_embeddings", 512),
    ("type_vocab_size", "type_vocab_size", 2),
    ("hidden_dropout_prob", "hidden_dropout_rate", 0.1),
    ("attention_probs_dropout_prob", "attention_dropout_rate", 0.1),
    ("initializer_range", "initializer_range", 0.02),
    ("layer_norm_eps", "layer_norm_eps", 1e-12),
)


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One weight: its bertjax path and shape, its HF and TF1 names and orientation.

    ``in_ndim`` is how many leading bertjax dims are the input features: the 2-D form HF/TF1
    store is ``[prod(shape[:in_ndim]), prod(shape[in_ndim:])]`` (None: a vector, stored flat).
    HF stores dense weights ``[out, in]`` (``hf_t``), TF1 ``[in, out]`` except the NSP
    ``output_weights`` (``tf1_t``).
    """

    head: str
    path: tuple[str, ...]
    shape: tuple[int, ...]
    hf: str
    tf1: str
    in_ndim: int | None = None
    hf_t: bool = False
    tf1_t: bool = False

    @property
    def flat_shape(self) -> tuple[int, ...]:
        if self.in_ndim is None:
            return (math.prod(self.shape),)
        split = self.in_ndim
        return (math.prod(self.shape[:split]), math.prod(self.shape[split:]))


def _dense(head, path, shape, in_ndim, hf, tf1, nsp=False) -> list[_Entry]:
    kernel, bias = ("output_weights", "output_bias") if nsp else ("kernel", "bias")
    return [
        _Entry(
            head, (*path, "kernel"), shape, f"{hf}.weight", f"{tf1}/{kernel}", in_ndim, True, nsp
        ),
        _Entry(head, (*path, "bias"), shape[in_ndim:], f"{hf}.bias", f"{tf1}/{bias}"),
    ]


def _norm(head, path, hidden, hf, tf1) -> list[_Entry]:
    return [
        _Entry(head, (*path, "scale"), (hidden,), f"{hf}.weight", f"{tf1}/gamma"),
        _Entry(head, (*path, "bias"), (hidden,), f"{hf}.bias", f"{tf1}/beta"),
    ]


def _layer_entries(cfg: BertConfig, i: int) -> list[_Entry]:
    h, n, d, f = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.intermediate_size
    p, hf, tf = ("encoder", "layers", f"layer_{i}"), f"encoder.layer.{i}", f"bert/encoder/layer_{i}"
    out = []
    for qkv in ("query", "key", "value"):
        out += _dense("encoder", (*p, "attention", qkv), (h, n, d), 1,
                      f"{hf}.attention.self.{qkv}", f"{tf}/attention/self/{qkv}")  # fmt: skip
    out += _dense("encoder", (*p, "attention", "output"), (n, d, h), 2,
                  f"{hf}.attention.output.dense", f"{tf}/attention/output/dense")  # fmt: skip
    out += _norm("encoder", (*p, "attention_layer_norm"), h, f"{hf}.attention.output.LayerNorm",
                 f"{tf}/attention/output/LayerNorm")  # fmt: skip
    out += _dense("encoder", (*p, "intermediate"), (h, f), 1,
                  f"{hf}.intermediate.dense", f"{tf}/intermediate/dense")  # fmt: skip
    out += _dense("encoder", (*p, "output"), (f, h), 1, f"{hf}.output.dense", f"{tf}/output/dense")
    out += _norm("encoder", (*p, "output_layer_norm"), h,
                 f"{hf}.output.LayerNorm", f"{tf}/output/LayerNorm")  # fmt: skip
    return out


def _entries(cfg: BertConfig) -> list[_Entry]:
    """Every weight bertjax knows, grouped by head ('encoder', 'pooler', 'mlm', 'nsp')."""
    h, emb = cfg.hidden_size, ("encoder", "embeddings")
    rows = {"word_embeddings": cfg.vocab_size, "position_embeddings": cfg.max_position_embeddings,
            "token_type_embeddings": cfg.type_vocab_size}  # fmt: skip
    out = [
        _Entry(
            "encoder",
            (*emb, name, "embedding"),
            (n, h),
            f"embeddings.{name}.weight",
            f"bert/embeddings/{name}",
            in_ndim=1,
        )  # fmt: skip
        for name, n in rows.items()
    ]
    out += _norm(
        "encoder", (*emb, "layer_norm"), h, "embeddings.LayerNorm", "bert/embeddings/LayerNorm"
    )
    for i in range(cfg.num_layers):
        out += _layer_entries(cfg, i)
    out += _dense("pooler", ("pooler", "dense"), (h, h), 1, "pooler.dense", "bert/pooler/dense")
    out += _dense("mlm", ("mlm", "transform"), (h, h), 1,
                  "cls.predictions.transform.dense", "cls/predictions/transform/dense")  # fmt: skip
    out += _norm("mlm", ("mlm", "layer_norm"), h, "cls.predictions.transform.LayerNorm",
                 "cls/predictions/transform/LayerNorm")  # fmt: skip
    out.append(_Entry("mlm", ("mlm", "output_bias"), (cfg.vocab_size,), "cls.predictions.bias",
                      "cls/predictions/output_bias"))  # fmt: skip
    out += _dense("nsp", ("nsp", "dense"), (h, 2), 1, "cls.seq_relationship",
                  "cls/seq_relationship", nsp=True)  # fmt: skip
    return out


def _to_params(tensors: dict[str, np.ndarray], cfg: BertConfig, fmt: str, source: str) -> dict:
    """Named source tensors -> nested bertjax params. Consumes ``tensors``; leftovers are errors."""
    entries = _entries(cfg)
    present = {e.head for e in entries if getattr(e, fmt) in tensors}
    present.add("encoder")  # an encoder is never optional
    params: dict = {}
    for e in entries:
        if e.head not in present:
            continue
        name = getattr(e, fmt)
        if name not in tensors:
            raise ConvertError(f"{source}: missing weight {name!r} (needed by the {e.head!r} part)")
        value = np.asarray(tensors.pop(name))
        expected = tuple(reversed(e.flat_shape)) if getattr(e, f"{fmt}_t") else e.flat_shape
        if value.shape != expected:
            raise ConvertError(
                f"{source}: weight {name!r} has shape {value.shape}, but the config "
                f"implies {expected}"
            )
        value = value.T if getattr(e, f"{fmt}_t") else value
        node = params
        for key in e.path[:-1]:
            node = node.setdefault(key, {})
        node[e.path[-1]] = np.ascontiguousarray(value.reshape(e.shape), dtype=np.float32)
    if tensors:
        raise ConvertError(
            f"{source}: unknown weight name(s) {sorted(tensors)[:5]} "
            f"({len(tensors)} left over); bertjax maps BERT encoder, pooler, MLM and "
            "NSP weights only"
        )
    return params


def _from_params(params: dict, cfg: BertConfig, fmt: str) -> dict[str, np.ndarray]:
    """Nested bertjax params -> named tensors in ``fmt`` ('hf' or 'tf1') orientation."""
    extra = sorted(set(params) - {"encoder", "pooler", "mlm", "nsp"})
    if extra:
        raise ConvertError(f"params have head(s) {extra} with no HF/TF1 equivalent")
    out = {}
    for e in _entries(cfg):
        if e.head not in params:
            continue
        value = params
        for key in e.path:
            value = value[key]
        value = np.asarray(value, dtype=np.float32).reshape(e.flat_shape)
        out[getattr(e, fmt)] = np.ascontiguousarray(value.T if getattr(e, f"{fmt}_t") else value)
    return out


def _vocab_size(vocab_file: str) -> int:
    if not os.path.exists(vocab_file):
        raise ConvertError(f"{vocab_file}: vocab file not found")
    try:
        with open(vocab_file, encoding="utf-8") as f:
            return len(f.readlines())
    except UnicodeDecodeError as e:
        message = f"{vocab_file}: vocab file not UTF-8 ({e.reason} at byte {e.start})"
        raise ConvertError(message) from None


def _check_vocab(vocab_file: str, cfg: BertConfig, weights: str, key: str) -> None:
    n = _vocab_size(vocab_file)
    if n != cfg.vocab_size:
        raise ConvertError(
            f"{vocab_file}: {n} tokens, but {weights} key {key!r} has {cfg.vocab_size} rows"
        )


def _read_json(path: str) -> dict:
    """A JSON object file; ConvertError naming ``path`` if missing, not UTF-8 JSON or no object."""
    if not os.path.isfile(path):
        raise ConvertError(f"{path}: file not found")
    try:
        with open(path, "rb") as f:
            value = json.loads(f.read().decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError, json.JSONDecodeError
        raise ConvertError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise ConvertError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _json_bool(values: dict, key: str, default: bool, path: str) -> bool:
    """``values[key]`` as a bool; a string like ``"false"`` is an error, not ``True``."""
    value = values.get(key, default)
    if not isinstance(value, bool):
        raise ConvertError(f"{path}: {key}={value!r:.40}, expected true or false")
    return value


def _config_from_json(values: dict, path: str, act_map: dict[str, str]) -> BertConfig:
    """HF config.json / original bert_config.json -> BertConfig (absent fields: HF's defaults)."""
    missing = [k for k, _, default in _CONFIG_FIELDS if default is None and k not in values]
    if missing:
        raise ConvertError(f"{path}: missing field(s) {missing}")
    act = values.get("hidden_act", "gelu")
    if not isinstance(act, str) or act not in act_map:
        raise ConvertError(f"{path}: hidden_act={act!r:.40}; expected one of {sorted(act_map)}")
    position_kind = values.get("position_embedding_type", "absolute")
    if position_kind != "absolute":
        raise ConvertError(
            f"{path}: position_embedding_type={position_kind!r:.40}; expected 'absolute'"
        )
    fields = {ours: values.get(theirs, default) for theirs, ours, default in _CONFIG_FIELDS}
    causal = _json_bool(values, "is_decoder", False, path)  # HF's BertModel: causal as a decoder
    try:
        return BertConfig(**fields, hidden_act=act_map[act],
                          attention="causal" if causal else "bidirectional")  # fmt: skip
    except ValueError as e:
        raise ConvertError(f"{path}: {e}") from None


# ---------------------------------------------------------------- HuggingFace


def _hf_weight_files(src: str) -> list[str]:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if os.path.exists(os.path.join(src, name)):
            return [os.path.join(src, name)]
        index = os.path.join(src, f"{name}.index.json")
        if os.path.exists(index):
            weight_map = _read_json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not all(
                isinstance(f, str) for f in weight_map.values()
            ):
                raise ConvertError(f"{index}: expected a weight_map of weight name -> file name")
            return [os.path.join(src, s) for s in sorted(set(weight_map.values()))]
    raise ConvertError(f"{src}: no model.safetensors or pytorch_model.bin found")


def _read_hf_tensors(path: str) -> dict[str, np.ndarray]:
    if not os.path.exists(path):
        raise ConvertError(f"{path}: weights file not found")
    if path.endswith(".safetensors"):
        from safetensors.numpy import load_file  # noqa: PLC0415 - only HF conversion needs it

        reader = load_file
    else:
        try:
            import torch  # noqa: PLC0415 - optional: only pytorch_model.bin needs it
        except ImportError:
            raise ConvertError(f"{path}: reading pytorch_model.bin needs torch") from None

        def reader(name):
            state = torch.load(name, map_location="cpu", weights_only=True)
            return {
                k: (v.float() if v.is_floating_point() else v).numpy() for k, v in state.items()
            }

    try:
        return reader(path)
    except Exception as e:  # noqa: BLE001 - corrupt/unsupported files: name the file, no traceback
        raise ConvertError(f"{path}: unreadable weights file ({type(e).__name__}: {e})") from None


def _normalize_hf_names(tensors: dict[str, np.ndarray], source: str) -> dict[str, np.ndarray]:
    """Strips ``bert.``, renames gamma/beta, drops buffers and the tied decoder."""
    out = {}
    for name, value in tensors.items():
        if name.startswith("bert."):
            name = name[len("bert.") :]
        if name.endswith("LayerNorm.gamma"):
            name = name[: -len("gamma")] + "weight"
        elif name.endswith("LayerNorm.beta"):
            name = name[: -len("beta")] + "bias"
        out[name] = value
    out.pop("embeddings.position_ids", None)  # a buffer (arange), not a weight
    tied = {
        "cls.predictions.decoder.weight": "embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }
    for name, target in tied.items():
        if name in out:
            value = out.pop(name)
            if target not in out or not np.array_equal(value, out[target]):
                raise ConvertError(
                    f"{source}: {name!r} is not tied to {target!r}; bertjax's MLM "
                    "decoder is always tied"
                )
    return out


def read_hf(src: str, do_lower_case: bool | None = None) -> Converted:
    """A HuggingFace BERT directory -> :class:`Converted`."""
    config_path = os.path.join(src, "config.json")
    cfg = _config_from_json(_read_json(config_path), config_path, _HF_ACT)
    files = _hf_weight_files(src)
    tensors = {}
    for path in files:
        tensors.update(_read_hf_tensors(path))
    source = files[0] if len(files) == 1 else src
    params = _to_params(_normalize_hf_names(tensors, source), cfg, "hf", source)
    vocab_file = os.path.join(src, "vocab.txt")
    _check_vocab(vocab_file, cfg, source, "embeddings.word_embeddings.weight")
    tok_config = os.path.join(src, "tokenizer_config.json")
    if os.path.exists(tok_config) and "do_lower_case" in _read_json(tok_config):
        do_lower_case = _json_bool(_read_json(tok_config), "do_lower_case", False, tok_config)
    return Converted(params, cfg, vocab_file, _require_casing(do_lower_case, src))


def _require_casing(do_lower_case: bool | None, src: str) -> bool:
    if do_lower_case is None:
        raise ConvertError(
            f"{src}: casing unknown (no tokenizer_config.json do_lower_case); pass "
            "--do_lower_case=true|false"
        )
    return bool(do_lower_case)


def write_hf(dst: str, conv: Converted, *, overwrite: bool = False) -> str:
    """Writes a HF directory that ``transformers`` loads with no missing/unexpected keys."""
    from safetensors.numpy import save_file  # noqa: PLC0415

    cfg, heads = conv.config, set(conv.params) - {"encoder"}
    if heads == {"pooler", "mlm", "nsp"}:
        arch, prefix = "BertForPreTraining", "bert."
    elif heads <= {"pooler"}:
        arch, prefix = "BertModel", ""
    else:
        raise ConvertError(
            f"heads {sorted(heads)}: HF export needs pooler+mlm+nsp "
            "(BertForPreTraining) or at most a pooler (BertModel)"
        )
    _check_vocab(conv.vocab_file, cfg, "params", "encoder/embeddings/word_embeddings")
    tensors = {
        (n if n.startswith("cls.") else prefix + n): v
        for n, v in _from_params(conv.params, cfg, "hf").items()
    }
    hf_config = {
        "architectures": [arch],
        "model_type": "bert",
        **{theirs: getattr(cfg, ours) for theirs, ours, _ in _CONFIG_FIELDS},
        "hidden_act": _HF_ACT_OUT[cfg.hidden_act],
        "position_embedding_type": "absolute",
        "is_decoder": cfg.attention == "causal",
        "pad_token_id": 0,
        "torch_dtype": "float32",
    }
    tok_config = {
        "do_lower_case": conv.do_lower_case,
        "tokenizer_class": "BertTokenizer",
        "model_max_length": cfg.max_position_embeddings,
    }

    def fill(tmp: str) -> None:
        save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(hf_config, f, indent=2)
        with open(os.path.join(tmp, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(tok_config, f, indent=2)
        shutil.copyfile(conv.vocab_file, os.path.join(tmp, "vocab.txt"))

    return _write_atomically(dst, fill, overwrite)


def _write_atomically(dst: str, fill, overwrite: bool) -> str:
    dst = os.path.abspath(dst)
    if os.path.exists(dst) and not overwrite:
        raise ConvertError(f"{dst}: already exists (pass --overwrite to replace it)")
    tmp = os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        os.makedirs(tmp)
        fill(tmp)
        if os.path.exists(dst):
            shutil.rmtree(dst)
        os.rename(tmp, dst)
    except (OSError, SafetensorError) as e:  # a full disk: one line, nothing left at dst
        raise ConvertError(f"writing {dst} failed ({type(e).__name__}: {e})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dst


# ---------------------------------------------------------------- original TF1


def _tf1_prefix(src: str) -> str:
    if os.path.exists(src + ".index"):
        return src
    if not os.path.isdir(src):
        raise ConvertError(f"{src}: no such TF1 checkpoint directory or prefix")
    indexes = sorted(f for f in os.listdir(src) if ".ckpt" in f and f.endswith(".index"))
    if len(indexes) != 1:
        raise ConvertError(
            f"{src}: expected one TF1 checkpoint (bert_model.ckpt.index), found {indexes or 'none'}"
        )
    return os.path.join(src, indexes[0][: -len(".index")])


def read_tf1(src: str, do_lower_case: bool | None = None) -> Converted:
    """Google's original TF1 BERT checkpoint (directory or ckpt prefix) -> :class:`Converted`."""
    from bertjax import startup  # noqa: PLC0415 - TensorFlow is heavy; only TF1 needs it

    tf = startup.import_tensorflow()

    prefix = _tf1_prefix(src)
    directory = src if os.path.isdir(src) else os.path.dirname(prefix)
    config_path = os.path.join(directory, "bert_config.json")
    cfg = _config_from_json(_read_json(config_path), config_path, _TF1_ACT)
    try:
        reader = tf.train.load_checkpoint(prefix)
    except Exception as e:  # noqa: BLE001 - TF raises a zoo of errors; name the file instead.
        raise ConvertError(f"{prefix}: unreadable TF checkpoint ({type(e).__name__})") from None
    names = [
        n
        for n in reader.get_variable_to_shape_map()
        if n != "global_step" and not n.endswith(_OPTIMIZER_SLOTS)
    ]
    try:
        tensors = {n: reader.get_tensor(n) for n in names}
    except Exception as e:  # noqa: BLE001
        raise ConvertError(
            f"{prefix}: unreadable TF checkpoint data ({type(e).__name__})"
        ) from None
    params = _to_params(tensors, cfg, "tf1", prefix)
    vocab_file = os.path.join(directory, "vocab.txt")
    _check_vocab(vocab_file, cfg, prefix, "bert/embeddings/word_embeddings")
    return Converted(params, cfg, vocab_file, _require_casing(do_lower_case, directory))


# ---------------------------------------------------------------- bertjax and dispatch


def read_bertjax(src: str) -> Converted:
    try:
        params, cfg, meta = checkpoint.load_params(src)
    except (checkpoint.CheckpointError, checkpoint_manifest.CheckpointCorrupt) as e:
        raise ConvertError(str(e)) from None
    vocab_file = os.path.join(src, checkpoint.VOCAB_FILE)
    _check_vocab(
        vocab_file,
        cfg,
        os.path.join(src, checkpoint.PARAMS_DIR),
        "encoder/embeddings/word_embeddings/embedding",
    )
    return Converted(params, cfg, vocab_file, bool(meta["do_lower_case"]))


def read_workdir(src: str) -> Converted:
    """The newest verified checkpoint of a training workdir (``WORKDIR/checkpoints/``)."""
    try:
        params, cfg, vocab_file, do_lower_case = workdir.latest_params(src)
    except (checkpoint.CheckpointError, checkpoint_manifest.CheckpointCorrupt) as e:
        raise ConvertError(str(e)) from None
    _check_vocab(vocab_file, cfg, src, "encoder/embeddings/word_embeddings/embedding")
    return Converted(params, cfg.portable(), vocab_file, bool(do_lower_case))


def detect_format(src: str) -> str:
    """'bertjax' | 'workdir' | 'hf' | 'tf1' from the files at ``src``."""
    join = lambda name: os.path.join(src, name)
    if os.path.exists(src + ".index"):
        return "tf1"
    if not os.path.isdir(src):
        raise ConvertError(f"{src}: no such checkpoint directory")
    if checkpoint.is_params_checkpoint(src):
        return "bertjax"
    # Before config.json / bert_config.json: a workdir holds both next to its checkpoints.
    if os.path.isdir(join(workdir.CHECKPOINTS_DIR)):
        return "workdir"
    if os.path.exists(join("config.json")):
        return "hf"
    if os.path.exists(join("bert_config.json")):
        return "tf1"
    raise ConvertError(
        f"{src}: not a recognised checkpoint (no {checkpoint.META_FILE}, "
        "checkpoints/, config.json or bert_config.json)"
    )


def load(src: str, fmt: str | None = None, do_lower_case: bool | None = None) -> Converted:
    """Reads any supported checkpoint into memory (``fmt`` None = detect)."""
    fmt = fmt or detect_format(src)
    if fmt == "hf":
        return read_hf(src, do_lower_case)
    if fmt == "tf1":
        return read_tf1(src, do_lower_case)
    if fmt == "bertjax":
        return read_bertjax(src)
    if fmt == "workdir":
        return read_workdir(src)
    raise ConvertError(f"unknown source format {fmt!r}; expected hf, tf1, bertjax or workdir")


def convert(
    src: str,
    dst: str,
    to: str,
    fmt: str | None = None,
    do_lower_case: bool | None = None,
    overwrite: bool = False,
) -> str:
    if os.path.exists(dst) and not overwrite:
        raise ConvertError(f"{dst}: already exists (pass --overwrite to replace it)")
    conv = load(src, fmt, do_lower_case)
    if to == "hf":
        return write_hf(dst, conv, overwrite=overwrite)
    if to == "bertjax":
        try:
            return str(
                checkpoint.save_params(
                    dst,
                    conv.params,
                    conv.config,
                    conv.vocab_file,
                    conv.do_lower_case,
                    overwrite=overwrite,
                )
            )
        except checkpoint.CheckpointError as e:
            raise ConvertError(str(e)) from None
    raise ConvertError(f"--to={to!r}: expected 'bertjax' or 'hf'")


def _define_flags() -> None:
    """Only when run as a CLI, so importing this module (extract_features does) adds no flags."""
    flags.DEFINE_string("src", None, "Source checkpoint directory (or TF1 checkpoint prefix).")
    flags.DEFINE_string("dst", None, "Destination directory (must not exist unless --overwrite).")
    flags.DEFINE_enum("to", None, ["bertjax", "hf"], "Destination format.")
    flags.DEFINE_enum(
        "from",
        None,
        ["hf", "tf1", "bertjax", "workdir"],
        "Source format; detected from the files when absent.",
    )
    flags.DEFINE_boolean(
        "do_lower_case",
        None,
        "Casing of the vocab when the source does not record it (TF1, HF "
        "without tokenizer_config.json).",
    )
    flags.DEFINE_boolean("overwrite", False, "Replace --dst if it exists.")
    flags.mark_flags_as_required(["src", "dst", "to"])


def _run(fv: flags.FlagValues) -> None:
    out = convert(fv.src, fv.dst, fv.to, fv["from"].value, fv.do_lower_case, fv.overwrite)
    print(f"wrote {fv.to} checkpoint to {out}")


def main() -> None:  # also the console script bertjax-convert
    cli.run(_run, _define_flags, errors=(ConvertError,), prog="convert", tensorflow=False)


if __name__ == "__main__":
    main()
