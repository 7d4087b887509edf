"""HF ModernBERT (transformers' ``modeling_modernbert.py``) <-> bertjax's 'modernbert'
architecture: the ``config.json`` fields and the weight names, both ways.

HF's names (``ModernBertModel``; its composite models prefix them with ``model.``) against
bertjax's params (``bertjax.model.encoder``, ``heads.MaskedLMHead``), for hidden H, heads N,
head dim D, intermediate F, vocab V; HF stores linear maps ``[out, in]``:

    embeddings.tok_embeddings.weight  [V, H]     encoder/embeddings/word_embeddings/embedding
    embeddings.norm.{weight,bias}                encoder/embeddings/layer_norm/{scale,bias}
    layers.{i}.attn_norm.*  (i > 0)              encoder/layers/layer_{i}/attention_norm/*
    layers.{i}.attn.Wqkv.weight  [3 N D, H]      .../attention/{query,key,value}/kernel <H, N, D>
    layers.{i}.attn.Wo.weight    [H, N D]        .../attention/output/kernel <N, D, H>
    layers.{i}.mlp_norm.*                        .../mlp_norm/*
    layers.{i}.mlp.Wi.weight     [2 F, H]        .../intermediate/kernel <H, 2, F> (input, gate)
    layers.{i}.mlp.Wo.weight     [H, F]          .../output/kernel <F, H>
    final_norm.*                                 encoder/final_norm/*
    head.dense.weight [H, H], head.norm.*        mlm/transform/kernel, mlm/layer_norm/*
    decoder.weight (tied), decoder.bias [V]      (the word embeddings), mlm/output_bias

A fine-tuned model (``ModernBertFor{SequenceClassification,TokenClassification,
QuestionAnswering,MultipleChoice}``: ``bertjax.model.heads``' 'modernbert' task models) has, in
place of the MLM head, C outputs (labels; 2 for spans, 1 for a choice):

    head.dense.weight [H, H], head.norm.*        head/transform/kernel, head/layer_norm/*
    classifier.{weight [C, H], bias [C]}         classifier/dense/{kernel <H, C>, bias}

Biases (``.bias``) exist where the config's ``attention_bias``, ``mlp_bias``, ``norm_bias``,
``classifier_bias`` (the head's dense) and ``decoder_bias`` say. HF's dropouts map to
``attention_dropout_rate`` (``attention_dropout``) and ``hidden_dropout_rate``
(``embedding_dropout`` = ``mlp_dropout``, which must agree).
"""

from __future__ import annotations

import numpy as np

from bertjax.interop.converted import ConvertError
from bertjax.interop.mapping import HF_ACT, HF_ACT_OUT
from bertjax.model.config import BertConfig

# (config.json field, BertConfig field, default when absent; None = required).
CONFIG_FIELDS = (
    ("vocab_size", "vocab_size", None),
    ("hidden_size", "hidden_size", None),
    ("num_hidden_layers", "num_layers", None),
    ("num_attention_heads", "num_heads", None),
    ("intermediate_size", "intermediate_size", None),
    ("max_position_embeddings", "max_position_embeddings", 8192),
    ("attention_dropout", "attention_dropout_rate", 0.0),
    ("initializer_range", "initializer_range", 0.02),
    ("norm_eps", "layer_norm_eps", 1e-5),
    ("global_attn_every_n_layers", "global_attn_every_n_layers", 3),
    ("local_attention", "local_attention", 128),
    ("global_rope_theta", "global_rope_theta", 160000.0),
    ("attention_bias", "attention_bias", False),
    ("mlp_bias", "mlp_bias", False),
    ("norm_bias", "norm_bias", False),
    ("classifier_bias", "head_bias", False),
    ("decoder_bias", "decoder_bias", True),
    ("classifier_pooling", "classifier_pooling", "cls"),
    ("classifier_dropout", "classifier_dropout_rate", 0.0),
)
# HF task class -> bertjax fine-tuning head (bertjax.finetune.tasks.HEADS; 'classification'
# is 'regression' for problem_type regression or one label), and back.
TASK_CLASSES = {
    "ModernBertForSequenceClassification": "classification",
    "ModernBertForTokenClassification": "tagging",
    "ModernBertForQuestionAnswering": "span",
    "ModernBertForMultipleChoice": "choice",
}
TASK_ARCHITECTURES = {head: cls for cls, head in TASK_CLASSES.items()}
TASK_ARCHITECTURES["regression"] = "ModernBertForSequenceClassification"


def is_modernbert(values: dict) -> bool:
    """Whether a parsed ``config.json`` is a ModernBERT one (its ``model_type``)."""
    return values.get("model_type") == "modernbert"


def config_from_hf(values: dict, path: str) -> BertConfig:
    """A ModernBERT ``config.json`` (parsed) -> BertConfig; ConvertError naming ``path`` and the
    field for anything bertjax cannot compute exactly."""
    fields = {"architecture": "modernbert"}
    for hf_name, name, default in CONFIG_FIELDS:
        if hf_name not in values and default is None:
            raise ConvertError(f"{path}: missing {hf_name!r}")
        fields[name] = values.get(hf_name, default)
    local_theta = values.get("local_rope_theta")
    fields["local_rope_theta"] = fields["global_rope_theta"] if local_theta is None else local_theta
    dropouts = {values.get("embedding_dropout", 0.0), values.get("mlp_dropout", 0.0)}
    if len(dropouts) != 1:
        raise ConvertError(
            f"{path}: embedding_dropout and mlp_dropout differ; bertjax has one rate"
        )
    fields["hidden_dropout_rate"] = dropouts.pop()
    for hf_name, name in (
        ("hidden_activation", "hidden_act"),
        ("classifier_activation", "head_act"),
    ):
        act = values.get(hf_name, "gelu")
        if act not in HF_ACT:
            raise ConvertError(f"{path}: {hf_name}={act!r:.40}; expected one of {sorted(HF_ACT)}")
        fields[name] = HF_ACT[act]
    if values.get("rope_scaling"):
        raise ConvertError(f"{path}: rope_scaling={values['rope_scaling']!r:.60} is not supported")
    try:
        return BertConfig(**fields)
    except (TypeError, ValueError) as e:
        raise ConvertError(f"{path}: {e}") from None


def config_to_hf(cfg: BertConfig) -> dict:
    """The ``config.json`` fields of ``cfg`` (a 'modernbert' BertConfig) for transformers."""
    values = {hf_name: getattr(cfg, name) for hf_name, name, _ in CONFIG_FIELDS}
    values.update(
        model_type="modernbert",
        architectures=["ModernBertForMaskedLM"],
        local_rope_theta=cfg.local_rope_theta,
        embedding_dropout=cfg.hidden_dropout_rate,
        mlp_dropout=cfg.hidden_dropout_rate,
        hidden_activation=HF_ACT_OUT[cfg.hidden_act],
        classifier_activation=HF_ACT_OUT[cfg.head_act],
    )
    return values


def _layout(cfg: BertConfig, mlm: bool, classes: int = 0):
    """(HF name, bertjax path, bertjax shape, HF -> bertjax, bertjax -> HF) for every weight, with
    the MLM head or a task head of ``classes`` outputs; ``Wqkv`` appears three times, once per
    projection, each taking its third."""
    h, n, d, f, v = (
        cfg.hidden_size,
        cfg.num_heads,
        cfg.head_dim,
        cfg.intermediate_size,
        cfg.vocab_size,
    )

    def same(x):
        return x

    def norm(hf, path):
        yield f"{hf}.weight", (*path, "scale"), (h,), same, same
        if cfg.norm_bias:
            yield f"{hf}.bias", (*path, "bias"), (h,), same, same

    def dense(hf, path, shape, in_ndim, bias):
        n_in = int(np.prod(shape[:in_ndim]))
        yield (
            f"{hf}.weight",
            (*path, "kernel"),
            shape,
            lambda w: w.T.reshape(shape),
            lambda k: k.reshape(n_in, -1).T,
        )
        if bias:
            yield (
                f"{hf}.bias",
                (*path, "bias"),
                shape[in_ndim:],
                lambda b: b.reshape(shape[in_ndim:]),
                lambda b: b.reshape(-1),
            )

    enc = ("encoder",)
    yield (
        "model.embeddings.tok_embeddings.weight",
        (*enc, "embeddings", "word_embeddings", "embedding"),
        (v, h),
        same,
        same,
    )
    yield from norm("model.embeddings.norm", (*enc, "embeddings", "layer_norm"))
    for i in range(cfg.num_layers):
        hf, path = f"model.layers.{i}", (*enc, "layers", f"layer_{i}")
        if i > 0:
            yield from norm(f"{hf}.attn_norm", (*path, "attention_norm"))
        for j, name in enumerate(("query", "key", "value")):
            part = slice(j * h, (j + 1) * h)
            kernel = (*path, "attention", name, "kernel")
            yield (
                f"{hf}.attn.Wqkv.weight",
                kernel,
                (h, n, d),
                lambda w, p=part: w[p].T.reshape(h, n, d),
                lambda k: k.reshape(h, -1).T,
            )
            if cfg.attention_bias:
                yield (
                    f"{hf}.attn.Wqkv.bias",
                    (*path, "attention", name, "bias"),
                    (n, d),
                    lambda b, p=part: b[p].reshape(n, d),
                    lambda b: b.reshape(-1),
                )
        yield from dense(
            f"{hf}.attn.Wo", (*path, "attention", "output"), (n, d, h), 2, cfg.attention_bias
        )
        yield from norm(f"{hf}.mlp_norm", (*path, "mlp_norm"))
        yield from dense(f"{hf}.mlp.Wi", (*path, "intermediate"), (h, 2, f), 1, cfg.mlp_bias)
        yield from dense(f"{hf}.mlp.Wo", (*path, "output"), (f, h), 1, cfg.mlp_bias)
    yield from norm("model.final_norm", (*enc, "final_norm"))
    if mlm:
        yield from dense("head.dense", ("mlm", "transform"), (h, h), 1, cfg.head_bias)
        yield from norm("head.norm", ("mlm", "layer_norm"))
        if cfg.decoder_bias:
            yield "decoder.bias", ("mlm", "output_bias"), (v,), same, same
    if classes:
        yield from dense("head.dense", ("head", "transform"), (h, h), 1, cfg.head_bias)
        yield from norm("head.norm", ("head", "layer_norm"))
        yield from dense("classifier", ("classifier", "dense"), (h, classes), 1, True)


def to_params(tensors: dict[str, np.ndarray], cfg: BertConfig, source: str) -> dict:
    """HF ModernBERT tensors (``ModernBertModel``'s names with or without ``model.``,
    ``ModernBertForMaskedLM``'s or a task class's) -> bertjax float32 params: ``encoder`` and,
    when the source has one, ``mlm`` or a task model's ``head`` and ``classifier``. ConvertError
    naming ``source`` and the tensor for a missing one or a wrong shape."""
    tensors = {
        (k if k.startswith(("model.", "head.", "decoder.", "classifier.")) else f"model.{k}"): v
        for k, v in tensors.items()
    }
    classes = 0
    if "classifier.weight" in tensors:
        classes = int(np.shape(tensors["classifier.weight"])[0])
    mlm = not classes and "head.dense.weight" in tensors
    params: dict = {}
    for hf_name, path, shape, to_bertjax, _ in _layout(cfg, mlm, classes):
        if hf_name not in tensors:
            raise ConvertError(f"{source}: missing tensor {hf_name!r} for {'/'.join(path)}")
        value = np.asarray(tensors[hf_name], dtype=np.float32)
        try:
            value = to_bertjax(value)
        except ValueError:
            value = None
        if value is None or value.shape != shape:
            got = tensors[hf_name].shape
            raise ConvertError(
                f"{source}: {hf_name} has shape {tuple(got)}; the config needs {shape}"
            )
        node = params
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = np.ascontiguousarray(value)
    return params


def from_params(params: dict, cfg: BertConfig) -> dict[str, np.ndarray]:
    """bertjax params (``encoder``, and ``mlm`` or a task model's ``head`` and ``classifier``
    when present) -> HF ModernBERT tensors, named as ``ModernBertForMaskedLM``'s or the task
    class's (``decoder.weight`` is the tied embedding)."""
    mlm = "mlm" in params
    classes = 0
    if "classifier" in params:
        classes = int(np.shape(params["classifier"]["dense"]["bias"])[0])
    tensors: dict[str, np.ndarray] = {}
    pending: dict[str, list] = {}
    for hf_name, path, _, _, to_hf in _layout(cfg, mlm, classes):
        value = params
        for key in path:
            value = value[key]
        # C order: safetensors writes an array's buffer as it lies (a transposed view's too).
        value = np.ascontiguousarray(to_hf(np.asarray(value, dtype=np.float32)))
        if ".Wqkv." in hf_name:
            pending.setdefault(hf_name, []).append(value)
            if len(pending[hf_name]) == 3:
                tensors[hf_name] = np.concatenate(pending.pop(hf_name), axis=0)
        else:
            tensors[hf_name] = value
    if mlm:
        tensors["decoder.weight"] = tensors["model.embeddings.tok_embeddings.weight"]
    return tensors
