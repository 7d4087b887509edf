"""The architecture of a BERT encoder: :class:`BertConfig` and the paper's model sizes.

The model only ever sees a frozen ``BertConfig``, never the run config. Architecture fields
(sizes, activation, dropout rates) travel with checkpoints as ``bert_config.json``; runtime fields
(``dtype``, ``param_dtype``, ``scan_layers``, ``remat_policy``, ``attention_impl``,
``cpu_forms``, ``gather_last_layer``) change speed or memory, never the function computed (with
dropout, ``gather_last_layer`` draws other masks of the same rate for the last layer's rows);
``attention_impl`` and ``cpu_forms`` are fitted to the platform when a step is built for its mesh
(``bertjax.training.sharding.bert_config_for``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

ACTIVATIONS = ("gelu_tanh", "gelu", "relu")
ATTENTION_KINDS = ("bidirectional", "causal")
# 'bert': the paper's post-LayerNorm encoder (learned positions, segment embeddings, biases).
# 'modernbert': ModernBERT's (Warner et al., 2024; transformers' modeling_modernbert.py):
# token embeddings only, pre-LayerNorm layers (none before layer 0's attention), RoPE, a GLU MLP,
# local attention on every layer i with i % global_attn_every_n_layers != 0, and a final norm.
ARCHITECTURES = ("bert", "modernbert")
POOLINGS = ("cls", "mean")  # 'modernbert' sentence heads (BertConfig.classifier_pooling)
# What each layer keeps for the backward pass (the rest is recomputed): none = everything;
# full = nothing; dots = every matmul output (with the XLA attention: its [B, N, L, L] scores);
# dots_no_batch = the projections' outputs; dots_attention = those and the flash kernel's
# outputs (the kernel's backward needs nothing else); attention = only the flash kernel's outputs.
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch", "dots_attention", "attention")
DTYPES = ("float32", "bfloat16", "float16")
# attention_impl: what a run config asks for, and the kernels a resolved BertConfig names
# (bertjax.model.attention.resolve; 'xla' is both).
ATTENTION_REQUESTS = ("auto", "xla", "fused")
ATTENTION_KERNELS = ("xla", "tpu", "gpu", "tpu_interpret", "gpu_interpret")
ATTENTION_IMPLS = ATTENTION_REQUESTS + ATTENTION_KERNELS[1:]


# The fields that give the weights their shapes (each a positive integer).
SHAPE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Architecture of a BERT encoder. Frozen, hashable, serialisable to JSON."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    # 'gelu_tanh' is the original BERT code's GELU; 'gelu' is the exact erf form (HF's 'gelu').
    hidden_act: str = "gelu_tanh"
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    dtype: str = "float32"  # compute dtype
    param_dtype: str = "float32"
    attention: str = "bidirectional"  # 'causal' for the paper's left-to-right ablation
    scan_layers: bool = False
    remat_policy: str = "none"
    # Which attention runs, the same function either way: an ask ('auto': the flash kernels on TPU
    # and GPU, XLA on CPU; 'xla'; 'fused') that bertjax.training.sharding.bert_config_for resolves
    # into a kernel ('xla', 'tpu', 'gpu', 'tpu_interpret', 'gpu_interpret') when a step is built
    # for its mesh (bertjax.model.attention). An unresolved ask runs XLA.
    attention_impl: str = "auto"
    # Before the first step a run compares its fused kernel with the XLA path on its own devices
    # and falls back to XLA if they differ (bertjax.training.kernel_check). False: no check.
    attention_check: bool = True
    # The XLA:CPU forms of bertjax.model.cpu_forms (2-D GEMM projections, a GEMV vocab-bias
    # gradient); set by bertjax.training.sharding.bert_config_for for a CPU mesh.
    cpu_forms: bool = False
    # Pretraining runs the last layer's queries, attention output, FFN and LayerNorms only at the
    # positions its heads read ([CLS] and the masked positions; K/V still see every position):
    # the same loss and gradients for ~(L - 1 - P) / L of one layer's work less (with dropout,
    # the gathered rows draw other masks of the same rate). A runtime choice like dtype. The
    # whole of it is bertjax.model.encoder's LayerStack and EncoderLayer; attention only takes
    # query positions. Unscanned layers only (with scan_layers the last layer runs in full).
    gather_last_layer: bool = True
    # ---- The architecture (ARCHITECTURES); the fields below shape 'modernbert' only. ----
    architecture: str = "bert"
    # Layer i attends globally when i % global_attn_every_n_layers == 0 (layer 0 is global), else
    # to the keys within local_attention // 2 rows on each side, inclusive (HF's window).
    global_attn_every_n_layers: int = 3
    local_attention: int = 128
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0
    # Which linear maps and norms carry a bias (ModernBERT: none but the decoder's). 'bert' has
    # every bias.
    attention_bias: bool = False
    mlp_bias: bool = False
    norm_bias: bool = False
    head_bias: bool = False  # the MLM head's dense (HF's classifier_bias)
    decoder_bias: bool = True  # the MLM decoder's output bias
    head_act: str = "gelu"  # the MLM and task heads' activation (HF's classifier_activation)
    # The fine-tuning heads (HF's ModernBertFor{SequenceClassification,TokenClassification,
    # QuestionAnswering,MultipleChoice}): what a sentence head reads ('cls': the [CLS] state;
    # 'mean': the mean over the example's tokens) and the dropout before the classifier.
    classifier_pooling: str = "cls"
    classifier_dropout_rate: float = 0.0

    def __post_init__(self):
        def check(cond, field, expected):
            if not cond:
                value = getattr(self, field)
                raise ValueError(f"BertConfig.{field}={value!r:.60}: expected {expected}")

        def number(value) -> bool:  # JSON may hold anything; compare only finite numbers
            is_real = isinstance(value, int | float) and not isinstance(value, bool)
            return is_real and math.isfinite(value)

        for field in SHAPE_FIELDS:
            value = getattr(self, field)
            is_int = isinstance(value, int) and not isinstance(value, bool)
            check(is_int and value > 0, field, "a positive integer")
        check(
            self.hidden_size % self.num_heads == 0,
            "hidden_size",
            f"a multiple of num_heads={self.num_heads}",
        )
        for field in ("hidden_dropout_rate", "attention_dropout_rate", "classifier_dropout_rate"):
            value = getattr(self, field)
            check(number(value) and 0.0 <= value < 1.0, field, "a rate in [0, 1)")
        for field in ("initializer_range", "layer_norm_eps"):
            value = getattr(self, field)
            check(number(value) and value >= 0.0, field, "a non-negative number")
        check(self.hidden_act in ACTIVATIONS, "hidden_act", f"one of {ACTIVATIONS}")
        check(self.attention in ATTENTION_KINDS, "attention", f"one of {ATTENTION_KINDS}")
        check(self.remat_policy in REMAT_POLICIES, "remat_policy", f"one of {REMAT_POLICIES}")
        check(self.attention_impl in ATTENTION_IMPLS, "attention_impl", f"one of {ATTENTION_IMPLS}")
        check(self.dtype in DTYPES, "dtype", f"one of {DTYPES}")
        check(self.param_dtype in DTYPES, "param_dtype", f"one of {DTYPES}")
        check(isinstance(self.gather_last_layer, bool), "gather_last_layer", "a bool")
        check(isinstance(self.scan_layers, bool), "scan_layers", "a bool")
        check(isinstance(self.cpu_forms, bool), "cpu_forms", "a bool")
        check(isinstance(self.attention_check, bool), "attention_check", "a bool")
        check(self.architecture in ARCHITECTURES, "architecture", f"one of {ARCHITECTURES}")
        for field in ("global_attn_every_n_layers", "local_attention"):
            value = getattr(self, field)
            is_int = isinstance(value, int) and not isinstance(value, bool)
            check(is_int and value > 0, field, "a positive integer")
        for field in ("global_rope_theta", "local_rope_theta"):
            value = getattr(self, field)
            check(number(value) and value > 0, field, "a positive number")
        for field in ("attention_bias", "mlp_bias", "norm_bias", "head_bias", "decoder_bias"):
            check(isinstance(getattr(self, field), bool), field, "a bool")
        check(self.head_act in ACTIVATIONS, "head_act", f"one of {ACTIVATIONS}")
        check(self.classifier_pooling in POOLINGS, "classifier_pooling", f"one of {POOLINGS}")
        if self.is_modern:
            check(
                not self.scan_layers,
                "scan_layers",
                "False with architecture='modernbert' (its layers differ: unrolled only)",
            )
            check(self.head_dim % 2 == 0, "hidden_size", "an even head dim for RoPE")

    @property
    def is_modern(self) -> bool:
        return self.architecture == "modernbert"

    def window(self, layer: int) -> int | None:
        """Layer ``layer``'s attention window: the keys within this many rows of the query on
        each side, or None (global attention)."""
        if not self.is_modern or layer % self.global_attn_every_n_layers == 0:
            return None
        return self.local_attention // 2

    def rope_theta(self, layer: int) -> float:
        """The RoPE base of layer ``layer`` (modernbert): global layers' or local layers'."""
        return self.global_rope_theta if self.window(layer) is None else self.local_rope_theta

    def bias(self, kind: str) -> bool:
        """Whether the ``kind`` ('attention', 'mlp', 'norm', 'head', 'decoder') maps carry a
        bias: always for 'bert', per its field for 'modernbert'."""
        return not self.is_modern or getattr(self, f"{kind}_bias")

    @property
    def output_init_scale(self) -> float:
        """ModernBERT's init scales the output projections' std by 1 / sqrt(2 num_layers)."""
        return 1.0 / math.sqrt(2.0 * self.num_layers) if self.is_modern else 1.0

    @property
    def has_local_layers(self) -> bool:
        return any(self.window(i) is not None for i in range(self.num_layers))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def computes_only_output_positions(self) -> bool:
        """Whether, given output positions, the last layer computes only them (see LayerStack)."""
        return self.gather_last_layer and not self.scan_layers

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> BertConfig:
        """``values`` (e.g. a parsed ``bert_config.json``) -> BertConfig; a ValueError whose one
        line names ``source`` for anything that is not a valid config."""
        if not isinstance(values, dict):
            raise ValueError(f"{source}: expected BertConfig fields, got {type(values).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"{source}: unknown BertConfig fields {unknown}; known: {sorted(known)}"
            )
        try:
            return cls(**values)
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    def replace(self, **changes) -> BertConfig:
        return dataclasses.replace(self, **changes)

    def portable(self) -> BertConfig:
        """The form written beside weights: unscanned, runtime choices at their defaults."""
        runtime = dict(scan_layers=False, remat_policy="none", attention_impl="auto")
        return self.replace(**runtime, cpu_forms=False, attention_check=True)


# Model sizes. "base"/"large" are the paper's BERT-BASE and BERT-LARGE; "L{l}_H{h}_A{a}" are the
# model-size ablation grid of the paper (Table 6); "tiny".."medium" are Google's BERT miniatures.
SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(num_layers=2, hidden_size=128, num_heads=2, intermediate_size=512),
    "mini": dict(num_layers=4, hidden_size=256, num_heads=4, intermediate_size=1024),
    "small": dict(num_layers=4, hidden_size=512, num_heads=8, intermediate_size=2048),
    "medium": dict(num_layers=8, hidden_size=512, num_heads=8, intermediate_size=2048),
    "base": dict(num_layers=12, hidden_size=768, num_heads=12, intermediate_size=3072),
    "large": dict(num_layers=24, hidden_size=1024, num_heads=16, intermediate_size=4096),
    "L3_H768_A12": dict(num_layers=3, hidden_size=768, num_heads=12, intermediate_size=3072),
    "L6_H768_A3": dict(num_layers=6, hidden_size=768, num_heads=3, intermediate_size=3072),
    "L6_H768_A12": dict(num_layers=6, hidden_size=768, num_heads=12, intermediate_size=3072),
    "L12_H768_A12": dict(num_layers=12, hidden_size=768, num_heads=12, intermediate_size=3072),
    "L12_H1024_A16": dict(num_layers=12, hidden_size=1024, num_heads=16, intermediate_size=4096),
    "L24_H1024_A16": dict(num_layers=24, hidden_size=1024, num_heads=16, intermediate_size=4096),
}

# 'modernbert' sizes: ModernBERT-base/-large (Warner et al., 2024) and Ettin's encoder ladder
# (Weller et al., 2025; its 150m and 400m are ModernBERT-base's and -large's shapes), all with
# head dim 64, ModernBERT's 50,368-token vocab and 8,192 positions. The names are the published
# parameter counts, which these shapes give (tests/model/modernbert_test.py).
MODERN_SIZES: dict[str, dict] = {
    name: dict(
        architecture="modernbert",
        vocab_size=50368,
        max_position_embeddings=8192,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=hidden // 64,
        intermediate_size=ffn,
    )  # fmt: skip
    for name, (layers, hidden, ffn) in {
        "ettin-17m": (7, 256, 384),
        "ettin-32m": (10, 384, 576),
        "ettin-68m": (19, 512, 768),
        "ettin-150m": (22, 768, 1152),
        "ettin-400m": (28, 1024, 2624),
        "ettin-1b": (28, 1792, 3840),
        "modernbert-base": (22, 768, 1152),
        "modernbert-large": (28, 1024, 2624),
    }.items()
}
