"""The name table: every bertjax weight with its HF and original TF1 name, shape and orientation,
and the ``config.json`` fields behind :class:`~bertjax.model.config.BertConfig`.

A weight belongs to one *head*, the top-level subtree of bertjax's params
(``bertjax.model.heads``): ``encoder``, ``pooler``, ``mlm``, ``nsp``, and the fine-tuning heads
``classifier`` (sequence and token classification, multiple choice: ``classifier/dense``) and
``span`` (question answering). HF names are given without the ``bert.`` prefix that HF's
composite models put before the encoder's and pooler's names (:data:`HF_HEAD_PREFIXES` are the
ones that never take it). HF stores dense weights ``[out, in]``, TF1 ``[in, out]`` except the NSP
``output_weights``; the fine-tuning heads have no TF1 names here (only HF checkpoints carry them).

Activations: HF's ``hidden_act: gelu`` is the exact erf GELU (bertjax ``gelu``), ``gelu_new`` and
``gelu_pytorch_tanh`` the tanh approximation (bertjax ``gelu_tanh``); the original TF code's
``gelu`` is the tanh approximation.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from bertjax.interop.converted import ConvertError, json_bool
from bertjax.model.config import BertConfig

HF_ACT = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
HF_ACT_OUT = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
TF1_ACT = {"gelu": "gelu_tanh", "relu": "relu"}
# (HF / original config.json field, BertConfig field, default when absent; None = required).
CONFIG_FIELDS = (
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
HEADS = ("encoder", "pooler", "mlm", "nsp", "classifier", "span")
HF_HEAD_PREFIXES = ("cls.", "classifier.", "qa_outputs.")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One weight: its bertjax path and shape, its HF and TF1 names and orientation.

    ``in_ndim`` is how many leading bertjax dims are the input features: the 2-D form HF/TF1
    store is ``[prod(shape[:in_ndim]), prod(shape[in_ndim:])]`` (None: a vector, stored flat).
    ``hf_t`` / ``tf1_t``: stored transposed (``[out, in]``). ``tf1`` is None for HF-only heads.
    """

    head: str
    path: tuple[str, ...]
    shape: tuple[int, ...]
    hf: str
    tf1: str | None
    in_ndim: int | None = None
    hf_t: bool = False
    tf1_t: bool = False

    @property
    def flat_shape(self) -> tuple[int, ...]:
        if self.in_ndim is None:
            return (math.prod(self.shape),)
        split = self.in_ndim
        return (math.prod(self.shape[:split]), math.prod(self.shape[split:]))


def _dense(head, path, shape, in_ndim, hf, tf1, nsp=False) -> list[Entry]:
    kernel, bias = ("output_weights", "output_bias") if nsp else ("kernel", "bias")
    tf1_kernel, tf1_bias = (f"{tf1}/{kernel}", f"{tf1}/{bias}") if tf1 else (None, None)
    return [
        Entry(head, (*path, "kernel"), shape, f"{hf}.weight", tf1_kernel, in_ndim, True, nsp),
        Entry(head, (*path, "bias"), shape[in_ndim:], f"{hf}.bias", tf1_bias),
    ]


def _norm(head, path, hidden, hf, tf1) -> list[Entry]:
    return [
        Entry(head, (*path, "scale"), (hidden,), f"{hf}.weight", f"{tf1}/gamma"),
        Entry(head, (*path, "bias"), (hidden,), f"{hf}.bias", f"{tf1}/beta"),
    ]


def _layer_entries(cfg: BertConfig, i: int) -> list[Entry]:
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


def entries(cfg: BertConfig, classes: int = 0, span: bool = False) -> list[Entry]:
    """The encoder's and pretraining heads' weights, and the fine-tuning heads asked for:
    ``classes`` > 0 adds the ``classifier`` with that many outputs (1 for regression and multiple
    choice), ``span`` the question-answering ``span`` head. A 'modernbert' config has its own
    table (``bertjax.interop.modernbert``): ConvertError."""
    if cfg.is_modern:
        raise ConvertError(
            "architecture 'modernbert': bertjax.convert does not export it yet "
            "(bertjax.interop.modernbert has its weight names)"
        )
    h, emb = cfg.hidden_size, ("encoder", "embeddings")
    rows = {"word_embeddings": cfg.vocab_size, "position_embeddings": cfg.max_position_embeddings,
            "token_type_embeddings": cfg.type_vocab_size}  # fmt: skip
    out = [
        Entry(
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
    out.append(Entry("mlm", ("mlm", "output_bias"), (cfg.vocab_size,), "cls.predictions.bias",
                     "cls/predictions/output_bias"))  # fmt: skip
    out += _dense("nsp", ("nsp", "dense"), (h, 2), 1, "cls.seq_relationship",
                  "cls/seq_relationship", nsp=True)  # fmt: skip
    if classes:
        out += _dense("classifier", ("classifier", "dense"), (h, classes), 1, "classifier", None)
    if span:
        out += _dense("span", ("span",), (h, 2), 1, "qa_outputs", None)
    return out


def to_params(tensors: dict[str, np.ndarray], cfg: BertConfig, fmt: str, source: str,
              classes: int = 0, span: bool = False) -> dict:  # fmt: skip
    """Named source tensors (``fmt`` 'hf' or 'tf1') -> nested bertjax params (the fine-tuning
    heads as in :func:`entries`). Consumes ``tensors``; a head with one weight present needs all
    of them; leftovers are errors."""
    table = entries(cfg, classes, span)
    present = {e.head for e in table if getattr(e, fmt) in tensors}
    present.add("encoder")  # an encoder is never optional
    params: dict = {}
    for e in table:
        if e.head not in present:
            continue
        name = getattr(e, fmt)
        if name not in tensors:
            raise ConvertError(f"{source}: missing weight {name!r} (needed by the {e.head!r} part)")
        value = np.asarray(tensors.pop(name))
        transposed = getattr(e, f"{fmt}_t")
        expected = tuple(reversed(e.flat_shape)) if transposed else e.flat_shape
        if value.shape != expected:
            raise ConvertError(
                f"{source}: weight {name!r} has shape {value.shape}, but the config "
                f"implies {expected}"
            )
        value = value.T if transposed else value
        node = params
        for key in e.path[:-1]:
            node = node.setdefault(key, {})
        node[e.path[-1]] = np.ascontiguousarray(value.reshape(e.shape), dtype=np.float32)
    if tensors:
        raise ConvertError(
            f"{source}: unknown weight name(s) {sorted(tensors)[:5]} "
            f"({len(tensors)} left over); bertjax maps BERT encoder, pooler, MLM and "
            "NSP weights, and the task heads of the architecture its config.json names"
        )
    return params


def classifier_outputs(params: dict) -> int:
    """The ``classifier`` head's output count (0 when there is none)."""
    if "classifier" not in params:
        return 0
    return int(np.shape(params["classifier"]["dense"]["bias"])[0])


def from_params(params: dict, cfg: BertConfig, fmt: str) -> dict[str, np.ndarray]:
    """Nested bertjax params -> named float32 tensors in ``fmt`` ('hf' or 'tf1') orientation."""
    extra = sorted(set(params) - set(HEADS))
    if extra:
        raise ConvertError(f"params have head(s) {extra} with no HF/TF1 equivalent")
    out = {}
    for e in entries(cfg, classifier_outputs(params), "span" in params):
        if e.head not in params:
            continue
        if getattr(e, fmt) is None:
            raise ConvertError(f"the {e.head!r} head has no {fmt} names")
        value = params
        for key in e.path:
            value = value[key]
        value = np.asarray(value, dtype=np.float32).reshape(e.flat_shape)
        out[getattr(e, fmt)] = np.ascontiguousarray(value.T if getattr(e, f"{fmt}_t") else value)
    return out


def config_from_json(values: dict, path: str, act_map: dict[str, str]) -> BertConfig:
    """HF config.json / original bert_config.json -> BertConfig (absent fields: HF's defaults)."""
    if values.get("model_type") == "modernbert":
        raise ConvertError(
            f"{path}: a ModernBERT checkpoint (model_type 'modernbert'); bertjax reads its weights "
            "with bertjax.interop.modernbert, but no command takes one yet"
        )
    missing = [k for k, _, default in CONFIG_FIELDS if default is None and k not in values]
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
    fields = {ours: values.get(theirs, default) for theirs, ours, default in CONFIG_FIELDS}
    causal = json_bool(values, "is_decoder", False, path)  # HF's BertModel: causal as a decoder
    try:
        return BertConfig(**fields, hidden_act=act_map[act],
                          attention="causal" if causal else "bidirectional")  # fmt: skip
    except ValueError as e:
        raise ConvertError(f"{path}: {e}") from None


def config_to_hf_json(cfg: BertConfig) -> dict:
    """The architecture fields of a HF ``config.json`` (the inverse of :func:`config_from_json`)."""
    return {
        **{theirs: getattr(cfg, ours) for theirs, ours, _ in CONFIG_FIELDS},
        "hidden_act": HF_ACT_OUT[cfg.hidden_act],
        "position_embedding_type": "absolute",
        "is_decoder": cfg.attention == "causal",
    }
