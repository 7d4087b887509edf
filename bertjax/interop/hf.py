"""HuggingFace BERT directories <-> :class:`~bertjax.interop.converted.Converted`.

A directory holds ``config.json``, ``model.safetensors`` (or ``pytorch_model.bin``, or a sharded
``*.index.json``), ``vocab.txt`` and optionally ``tokenizer_config.json`` (its ``do_lower_case``
wins over the caller's). The class in ``config.json``'s ``architectures`` says which heads there
are (:data:`ARCHITECTURES`):

    BertModel, BertForPreTraining          encoder (+ pooler, + mlm and nsp)
    BertForSequenceClassification          encoder, pooler, classifier   (task head
                                           'classification', or 'regression' for
                                           problem_type regression / one label)
    BertForTokenClassification             encoder, classifier           ('tagging')
    BertForQuestionAnswering               encoder, span (qa_outputs)    ('span')
    BertForMultipleChoice                  encoder, pooler, classifier   ('choice')

A ModernBERT directory (``model_type: modernbert``; ``ModernBertModel``, ``ModernBertForMaskedLM``
or ``ModernBertFor{SequenceClassification,TokenClassification,QuestionAnswering,MultipleChoice}``,
names in ``bertjax.interop.modernbert``) is read and written too, with a WordPiece ``vocab.txt``
or a byte-level BPE ``tokenizer.json`` (ModernBERT's own; read when there is no vocab.txt, its
casing its own normaliser's): a pretrained 'modernbert' checkpoint exports as
``ModernBertForMaskedLM`` (its pooler and NSP head, which ModernBERT has not, left out), a
fine-tuned one as its task's class, with the vocab's special-token ids and its tokenizer file
(a tokenizer.json with ``PreTrainedTokenizerFast`` in ``tokenizer_config.json``).

Reading accepts ``BertModel`` or composite key names, with or without the ``bert.`` prefix, old
``gamma``/``beta`` LayerNorm names too; tolerated and dropped: the ``position_ids`` buffer, and
the MLM decoder weight/bias when they equal the tied embedding / output bias.
``is_decoder: true`` (HF's causally masked BertModel) is bertjax's ``attention='causal'``. A task
model's labels (``id2label``), head and ``finetuning_task`` become the Converted's ``task``.
A directory on ``gs://`` is read object by object: its weights are streamed into memory
(``safetensors.numpy.load`` of the bytes, ``torch.load`` of a buffer), never staged on disk.

Writing picks the class from the params' heads and the ``task`` record: pretraining heads ->
``BertForPreTraining``; at most a pooler -> ``BertModel`` (encoder-only params: load those with
``add_pooling_layer=False``); a fine-tuned checkpoint -> its task's class, with ``id2label``,
``label2id``, ``problem_type`` (``single_label_classification`` or ``regression``) and
``finetuning_task``. Weights are float32 safetensors; ``config.json`` carries every architecture
field, with ``vocab.txt`` and ``tokenizer_config.json`` beside it. transformers loads the
directory with no missing or unexpected keys. The directory is written atomically
(``bertjax.atomic.directory``: renamed into place locally; on ``gs://``, ``config.json``, what
transformers reads first, is removed first and uploaded last).
"""

from __future__ import annotations

import io
import json
import os

import numpy as np
from etils import epath
from safetensors import SafetensorError

from bertjax import atomic
from bertjax.data.special_tokens import SPECIAL_TOKENS
from bertjax.interop import mapping, modernbert
from bertjax.interop.converted import (
    Converted,
    ConvertError,
    check_vocab,
    json_bool,
    read_json,
    require_casing,
    token_ids,
)
from bertjax.training import checkpoint

# HF class -> (the fine-tuning head it is, or None; bertjax's heads besides the encoder).
ARCHITECTURES = {
    "BertModel": (None, frozenset({"pooler"})),
    "BertForPreTraining": (None, frozenset({"pooler", "mlm", "nsp"})),
    "BertForSequenceClassification": ("classification", frozenset({"pooler", "classifier"})),
    "BertForTokenClassification": ("tagging", frozenset({"classifier"})),
    "BertForQuestionAnswering": ("span", frozenset({"span"})),
    "BertForMultipleChoice": ("choice", frozenset({"pooler", "classifier"})),
}
# Each fine-tuning head of bertjax.finetune.tasks.HEADS -> its HF class.
TASK_ARCHITECTURES = {
    "classification": "BertForSequenceClassification",
    "regression": "BertForSequenceClassification",
    "tagging": "BertForTokenClassification",
    "span": "BertForQuestionAnswering",
    "choice": "BertForMultipleChoice",
}


# ---------------------------------------------------------------- reading


def _weight_files(src: str) -> list[str]:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if epath.Path(os.path.join(src, name)).exists():
            return [os.path.join(src, name)]
        index = os.path.join(src, f"{name}.index.json")
        if epath.Path(index).exists():
            weight_map = read_json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not all(
                isinstance(f, str) for f in weight_map.values()
            ):
                raise ConvertError(f"{index}: expected a weight_map of weight name -> file name")
            return [os.path.join(src, s) for s in sorted(set(weight_map.values()))]
    raise ConvertError(f"{src}: no model.safetensors or pytorch_model.bin found")


def _read_tensors(path: str) -> dict[str, np.ndarray]:
    """A weights file's tensors. A local file is read in place (safetensors maps it); one on
    ``gs://`` is streamed into memory, never copied to a local file."""
    if not epath.Path(path).exists():
        raise ConvertError(f"{path}: weights file not found")
    local = not atomic.is_object_store(path)
    if path.endswith(".safetensors"):
        import safetensors.numpy  # noqa: PLC0415 - only HF conversion needs it

        reader = safetensors.numpy.load_file if local else safetensors.numpy.load
    else:
        try:
            import torch  # noqa: PLC0415 - optional: only pytorch_model.bin needs it
        except ImportError:
            raise ConvertError(f"{path}: reading pytorch_model.bin needs torch") from None

        def reader(source):
            source = source if local else io.BytesIO(source)
            state = torch.load(source, map_location="cpu", weights_only=True)
            return {
                k: (v.float() if v.is_floating_point() else v).numpy() for k, v in state.items()
            }

    try:
        return reader(path if local else epath.Path(path).read_bytes())
    except Exception as e:  # noqa: BLE001 - corrupt/unsupported files: name the file, no traceback
        raise ConvertError(f"{path}: unreadable weights file ({type(e).__name__}: {e})") from None


def _normalize_names(tensors: dict[str, np.ndarray], source: str) -> dict[str, np.ndarray]:
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


def _labels(values: dict, path: str) -> list[str]:
    """``id2label`` as a list (ids 0..n-1); HF's default names when absent."""
    id2label = values.get("id2label")
    if id2label is None:
        num_labels = values.get("num_labels", 2)
        if not isinstance(num_labels, int) or isinstance(num_labels, bool) or num_labels < 1:
            raise ConvertError(f"{path}: num_labels={num_labels!r:.40}, expected a positive int")
        return [f"LABEL_{i}" for i in range(num_labels)]
    if not isinstance(id2label, dict) or sorted(id2label, key=str) != sorted(
        str(i) for i in range(len(id2label))
    ):
        raise ConvertError(f"{path}: id2label={id2label!r:.60}, expected ids 0..n-1 -> names")
    labels = [id2label[str(i)] for i in range(len(id2label))]
    if not labels or not all(isinstance(label, str) for label in labels):
        raise ConvertError(f"{path}: id2label={id2label!r:.60}, expected label names (strings)")
    return labels


def _task(values: dict, path: str) -> tuple[dict | None, int]:
    """The task a config.json's architecture describes (None: no fine-tuning head; also for
    classes bertjax has no head for, e.g. BertForMaskedLM, whose encoder is still read) and the
    classifier's output count."""
    architectures = values.get("architectures") or [None]
    if not isinstance(architectures, list):
        raise ConvertError(f"{path}: architectures={architectures!r:.60}, expected a list")
    head = ARCHITECTURES.get(architectures[0], (None,))[0]
    head = head or modernbert.TASK_CLASSES.get(architectures[0])
    if head is None:
        return None, 0
    name = values.get("finetuning_task")
    if name is not None and not isinstance(name, str):
        raise ConvertError(f"{path}: finetuning_task={name!r:.40}, expected a string or null")
    if head in ("span", "choice"):
        return {"name": name, "head": head, "labels": None}, int(head == "choice")
    labels = _labels(values, path)
    problem = values.get("problem_type") if head == "classification" else None
    if problem not in (None, "regression", "single_label_classification"):
        raise ConvertError(f"{path}: problem_type={problem!r:.40}; bertjax has no such head")
    if problem == "regression" or (
        problem is None and head == "classification" and len(labels) == 1
    ):
        if len(labels) != 1:  # HF: no problem_type and one label is regression
            raise ConvertError(f"{path}: regression with {len(labels)} labels; bertjax's has 1")
        return {"name": name, "head": "regression", "labels": None}, 1
    return {"name": name, "head": head, "labels": labels}, len(labels)


def read(src: str, do_lower_case: bool | None = None, casing_from_vocab: bool = False) -> Converted:
    """A HuggingFace BERT directory -> :class:`Converted` (casing: ``tokenizer_config.json``'s,
    else ``do_lower_case``, else with ``casing_from_vocab`` what the vocab implies)."""
    config_path = os.path.join(src, "config.json")
    values = read_json(config_path)
    if modernbert.is_modernbert(values):
        return _read_modernbert(src, values, config_path, do_lower_case, casing_from_vocab)
    cfg = mapping.config_from_json(values, config_path, mapping.HF_ACT)
    task, classes = _task(values, config_path)
    files = _weight_files(src)
    tensors = {}
    for path in files:
        tensors.update(_read_tensors(path))
    source = files[0] if len(files) == 1 else src
    span = task is not None and task["head"] == "span"
    params = mapping.to_params(_normalize_names(tensors, source), cfg, "hf", source, classes, span)
    if task is not None:
        expected = ARCHITECTURES[TASK_ARCHITECTURES[task["head"]]][1]
        if set(params) - {"encoder"} != expected:
            raise ConvertError(
                f"{source}: a {TASK_ARCHITECTURES[task['head']]} needs the weights of "
                f"{sorted(expected)}, found {sorted(set(params) - {'encoder'})}"
            )
    vocab_file = os.path.join(src, "vocab.txt")
    check_vocab(vocab_file, cfg, source, "embeddings.word_embeddings.weight")
    casing = _casing(src, vocab_file, do_lower_case, casing_from_vocab)
    return Converted(params, cfg, vocab_file, casing, task)


def _casing(src: str, vocab_file: str, do_lower_case, casing_from_vocab: bool) -> bool:
    """The directory's casing: ``tokenizer_config.json``'s ``do_lower_case``, else the caller's,
    else (``casing_from_vocab``) what the vocab implies; an error when none says."""
    tok_config = os.path.join(src, "tokenizer_config.json")
    if epath.Path(tok_config).exists() and "do_lower_case" in read_json(tok_config):
        do_lower_case = json_bool(read_json(tok_config), "do_lower_case", False, tok_config)
    return require_casing(do_lower_case, src, vocab_file if casing_from_vocab else None)


def _read_modernbert(src, values, config_path, do_lower_case, casing_from_vocab) -> Converted:
    """A ModernBERT directory (``model_type: modernbert``): ``ModernBertModel``, ``…ForMaskedLM``
    or a task class's weights (``modernbert.TASK_CLASSES``) with a WordPiece ``vocab.txt`` (what
    :func:`write` exports) or, without one, ModernBERT's own byte-level BPE ``tokenizer.json``
    (its normaliser decides the casing)."""
    cfg = modernbert.config_from_hf(values, config_path)
    task, classes = _task(values, config_path)
    vocab_file = os.path.join(src, "vocab.txt")
    if not epath.Path(vocab_file).exists():
        vocab_file = os.path.join(src, "tokenizer.json")
        if not epath.Path(vocab_file).exists():
            raise ConvertError(f"{src}: a ModernBERT directory without vocab.txt or tokenizer.json")
        do_lower_case, casing_from_vocab = False, False  # the tokenizer's normaliser decides
    files = _weight_files(src)
    tensors = {}
    for path in files:
        tensors.update(_read_tensors(path))
    source = files[0] if len(files) == 1 else src
    decoder = tensors.pop("decoder.weight", None)
    embedding = tensors.get("model.embeddings.tok_embeddings.weight")
    if decoder is not None and (embedding is None or not np.array_equal(decoder, embedding)):
        raise ConvertError(f"{source}: 'decoder.weight' is not tied to the token embeddings")
    params = modernbert.to_params(tensors, cfg, source)
    if task is not None:
        outputs = {"span": 2, "choice": 1}.get(task["head"], classes)
        found = mapping.classifier_outputs(params)
        if found != outputs:
            raise ConvertError(
                f"{source}: a {values['architectures'][0]} ({task['head']}) needs a classifier "
                f"of {outputs} outputs, found {found or 'none'}"
            )
    check_vocab(vocab_file, cfg, source, "embeddings.tok_embeddings.weight")
    casing = _casing(src, vocab_file, do_lower_case, casing_from_vocab)
    return Converted(params, cfg, vocab_file, casing, task)


# ---------------------------------------------------------------- writing


def architecture(conv: Converted) -> tuple[str, dict]:
    """The HF class for ``conv`` and the task fields of its ``config.json``."""
    if "bilstm" in conv.params:
        raise ConvertError(
            "a BiLSTM head (params 'bilstm', from config.model.head_rnn='bilstm'): transformers "
            "has no BERT class with one, so it cannot be exported to HF"
        )
    heads = set(conv.params) - {"encoder"}
    if conv.task is None:
        if heads == {"pooler", "mlm", "nsp"}:
            return "BertForPreTraining", {}
        if heads <= {"pooler"}:
            return "BertModel", {}
        raise ConvertError(
            f"heads {sorted(heads)}: HF export needs pooler+mlm+nsp (BertForPreTraining), at "
            "most a pooler (BertModel), or a fine-tuned checkpoint's task record"
        )
    head = conv.task["head"]
    if head not in TASK_ARCHITECTURES:
        raise ConvertError(f"task head {head!r}: expected one of {sorted(TASK_ARCHITECTURES)}")
    arch = TASK_ARCHITECTURES[head]
    if heads != ARCHITECTURES[arch][1]:
        raise ConvertError(
            f"task head {head!r} ({arch}) needs params {sorted(ARCHITECTURES[arch][1])} besides "
            f"the encoder, found {sorted(heads)}"
        )
    return arch, _task_fields(conv, head != "span")


def _task_fields(conv: Converted, has_classifier: bool) -> dict:
    """The ``config.json`` fields of a fine-tuned checkpoint's task (its labels and problem
    type), after checking its classifier's outputs against them."""
    head, labels = conv.task["head"], conv.task["labels"]
    outputs = {"classification": len(labels or ()), "tagging": len(labels or ())}.get(head, 1)
    if conv.config.is_modern and head == "span":
        outputs = 2  # ModernBertForQuestionAnswering's classifier: start, end
    if has_classifier and mapping.classifier_outputs(conv.params) != outputs:
        raise ConvertError(
            f"task head {head!r} with labels {labels}: the classifier has "
            f"{mapping.classifier_outputs(conv.params)} outputs, expected {outputs}"
        )
    fields = {"finetuning_task": conv.task["name"]}
    if head in ("classification", "regression", "tagging"):
        names = labels if labels is not None else ["LABEL_0"]
        fields["id2label"] = {str(i): name for i, name in enumerate(names)}
        fields["label2id"] = {name: i for i, name in enumerate(names)}
    if head in ("classification", "regression"):
        kind = "regression" if head == "regression" else "single_label_classification"
        fields["problem_type"] = kind
    return fields


def _modernbert_export(conv: Converted) -> tuple[dict, dict]:
    """(tensors, config.json) of a 'modernbert' checkpoint: a fine-tuned one as its task's class
    (``modernbert.TASK_ARCHITECTURES``, with its labels), else ``ModernBertForMaskedLM`` with its
    MLM head, else ``ModernBertModel``; a pretraining checkpoint's pooler and NSP head (which
    ModernBERT has not) are left out. Special-token ids are the vocab's."""
    if "bilstm" in conv.params:
        raise ConvertError("a BiLSTM head: transformers has no ModernBERT class with one")
    task_fields = {}
    if conv.task is not None:
        head = conv.task["head"]
        if head not in modernbert.TASK_ARCHITECTURES or not {"head", "classifier"} <= set(
            conv.params
        ):
            raise ConvertError(
                f"task head {head!r} with params {sorted(conv.params)}: a 'modernbert' task model "
                f"has encoder, head and classifier ({sorted(modernbert.TASK_ARCHITECTURES)})"
            )
        task_fields = _task_fields(conv, True)
        params = {k: v for k, v in conv.params.items() if k in ("encoder", "head", "classifier")}
        arch = modernbert.TASK_ARCHITECTURES[head]
        tensors = modernbert.from_params(params, conv.config)
    else:
        params = {k: v for k, v in conv.params.items() if k in ("encoder", "mlm")}
        tensors = modernbert.from_params(params, conv.config)
        arch = "ModernBertForMaskedLM"
        if "mlm" not in params:  # ModernBertModel's own names
            arch, tensors = "ModernBertModel", {k[len("model.") :]: v for k, v in tensors.items()}
    ids = token_ids(conv.vocab_file)
    specials = {"pad_token_id": "[PAD]", "cls_token_id": "[CLS]", "sep_token_id": "[SEP]",
                "bos_token_id": "[CLS]", "eos_token_id": "[SEP]"}  # fmt: skip
    hf_config = {
        **modernbert.config_to_hf(conv.config),
        "architectures": [arch],
        **task_fields,
        **{key: ids.get(token, 0) for key, token in specials.items()},
        "torch_dtype": "float32",
    }
    return tensors, hf_config


def write(dst: str, conv: Converted, *, overwrite: bool = False) -> str:
    """Writes a HF directory that ``transformers`` loads with no missing/unexpected keys."""
    from safetensors.numpy import save_file  # noqa: PLC0415

    cfg = conv.config
    check_vocab(conv.vocab_file, cfg, "params", "encoder/embeddings/word_embeddings")
    if cfg.is_modern:
        tensors, hf_config = _modernbert_export(conv)
    else:
        arch, task_fields = architecture(conv)
        prefix = "" if arch == "BertModel" else "bert."
        tensors = {
            (n if n.startswith(mapping.HF_HEAD_PREFIXES) else prefix + n): v
            for n, v in mapping.from_params(conv.params, cfg, "hf").items()
        }
        hf_config = {
            "architectures": [arch],
            "model_type": "bert",
            **mapping.config_to_hf_json(cfg),
            **task_fields,
            "pad_token_id": 0,
            "torch_dtype": "float32",
        }
    tok_config = {
        "do_lower_case": conv.do_lower_case,
        "tokenizer_class": "BertTokenizer",
        "model_max_length": cfg.max_position_embeddings,
    }
    tokenizer_file = checkpoint.TOKENIZER_FILES[checkpoint.tokenizer_kind(conv.vocab_file)]
    if tokenizer_file == "tokenizer.json":  # a BPE: transformers' fast tokenizer reads it as is
        tok_config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": cfg.max_position_embeddings,
            **{f"{t.strip('[]').lower()}_token": t for t in SPECIAL_TOKENS},
        }
    elif tokenizer_file != "vocab.txt":
        raise ConvertError(f"{conv.vocab_file}: a SentencePiece model; HF export takes vocab.txt")

    dst = dst if atomic.is_object_store(dst) else os.path.abspath(dst)
    if epath.Path(dst).exists() and not overwrite:
        raise ConvertError(f"{dst}: already exists (pass --overwrite to replace it)")
    try:  # config.json last: what transformers reads first (bertjax.atomic.directory)
        with atomic.directory(dst, last=("config.json",), replace=True) as stage:
            save_file(tensors, os.path.join(stage, "model.safetensors"), metadata={"format": "pt"})
            for name, value in (("tokenizer_config.json", tok_config), ("config.json", hf_config)):
                with open(os.path.join(stage, name), "w", encoding="utf-8") as f:
                    json.dump(value, f, indent=2)
            with open(os.path.join(stage, tokenizer_file), "wb") as f:  # local or gs://
                f.write(epath.Path(conv.vocab_file).read_bytes())
    except (OSError, SafetensorError) as e:  # a full disk: one line, nothing left at dst
        raise ConvertError(f"writing {dst} failed ({type(e).__name__}: {e})") from None
    return dst
