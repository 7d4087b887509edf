"""The BERT encoder (Devlin et al., 2018) as pure-functional Flax linen modules.

The model only ever sees its frozen :class:`BertConfig`, never the run config. Losses live in
``losses.py`` and heads (pooler, MLM, NSP, task heads) in ``heads.py``.

Parameter tree of :class:`BertEncoder` (shapes for hidden H, heads N, head dim D = H / N,
intermediate F, vocab V, positions P, segment types T), with the logical axes of ``sharding.py``::

    embeddings/word_embeddings/embedding        <V, H>     (vocab, embed)
    embeddings/position_embeddings/embedding    <P, H>     (None, embed)
    embeddings/token_type_embeddings/embedding  <T, H>     (None, embed)
    embeddings/layer_norm/{scale,bias}          <H>        (embed)
    layers/layer_{i}/attention/{query,key,value}/kernel <H, N, D> (embed, heads, kv); bias <N, D>
    layers/layer_{i}/attention/output/kernel    <N, D, H>  (heads, kv, embed);  bias <H>
    layers/layer_{i}/attention_layer_norm/{scale,bias} <H>
    layers/layer_{i}/intermediate/kernel        <H, F>     (embed, mlp);        bias <F> (mlp)
    layers/layer_{i}/output/kernel              <F, H>     (mlp, embed);        bias <H>
    layers/layer_{i}/output_layer_norm/{scale,bias} <H>

With ``scan_layers=True`` the ``layer_{i}`` subtrees are stacked into one ``layers/layer`` subtree
whose leaves have a leading ``<num_layers>`` dimension with logical axis ``layers``;
:func:`stack_layers` / :func:`unstack_layers` convert between the two layouts.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bertjax import cpu_gemm
from bertjax import sharding as sh

ACTIVATIONS = ("gelu_tanh", "gelu", "relu")
ATTENTION_KINDS = ("bidirectional", "causal")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
DTYPES = ("float32", "bfloat16", "float16")
# Large negative added to masked attention logits (in float32). Finite, so a row with every key
# masked (a padding-only example) gives a uniform distribution instead of NaN.
_MASK_VALUE = -1e9


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
    # 'blas': dense layers and the MLM decoder as vendor-BLAS GEMMs (one CPU device, float32);
    # see cpu_gemm.py. A runtime choice like dtype: it changes speed, not the function computed.
    matmul: str = "xla"
    # Pretraining runs the last layer's queries, attention output, FFN and LayerNorms only at the
    # positions its heads read ([CLS] and the masked positions; K/V still see every position):
    # the same loss and gradients for ~(L - 1 - P) / L of one layer's work less. A runtime choice
    # like matmul. Unscanned layers only (with scan_layers the last layer runs in full).
    gather_last_layer: bool = True

    def __post_init__(self):
        def check(cond, field, expected):
            if not cond:
                value = getattr(self, field)
                raise ValueError(f"BertConfig.{field}={value!r}: expected {expected}")

        for field in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            check(
                isinstance(getattr(self, field), int) and getattr(self, field) > 0,
                field,
                "a positive integer",
            )
        check(
            self.hidden_size % self.num_heads == 0,
            "hidden_size",
            f"a multiple of num_heads={self.num_heads}",
        )
        check(0.0 <= self.hidden_dropout_rate < 1.0, "hidden_dropout_rate", "a rate in [0, 1)")
        check(
            0.0 <= self.attention_dropout_rate < 1.0, "attention_dropout_rate", "a rate in [0, 1)"
        )
        check(self.hidden_act in ACTIVATIONS, "hidden_act", f"one of {ACTIVATIONS}")
        check(self.attention in ATTENTION_KINDS, "attention", f"one of {ATTENTION_KINDS}")
        check(self.remat_policy in REMAT_POLICIES, "remat_policy", f"one of {REMAT_POLICIES}")
        check(self.dtype in DTYPES, "dtype", f"one of {DTYPES}")
        check(self.param_dtype in DTYPES, "param_dtype", f"one of {DTYPES}")
        check(self.matmul in cpu_gemm.MATMULS, "matmul", f"one of {cpu_gemm.MATMULS}")
        check(isinstance(self.gather_last_layer, bool), "gather_last_layer", "a bool")
        if self.matmul == "blas":
            check(self.dtype == "float32", "dtype", "'float32' with matmul='blas'")

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
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"{source}: unknown BertConfig fields {unknown}; known: {sorted(known)}"
            )
        return cls(**values)

    def replace(self, **changes) -> BertConfig:
        return dataclasses.replace(self, **changes)

    def portable(self) -> BertConfig:
        """The form written beside weights: unscanned layout, XLA matmuls (readers pick theirs)."""
        return self.replace(scan_layers=False, matmul="xla")


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


def config_for_size(size: str, **overrides) -> BertConfig:
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; known: {sorted(SIZES)}")
    return BertConfig(**{**SIZES[size], **overrides})


def _dtype(name: str):
    return jnp.dtype(name)


def _init(config: BertConfig, axes):
    # The original code initialises every weight from a truncated normal(0, initializer_range).
    return nn.with_logical_partitioning(
        nn.initializers.truncated_normal(config.initializer_range), axes
    )


def activation(name: str):
    if name == "gelu_tanh":
        return lambda x: jax.nn.gelu(x, approximate=True)
    if name == "gelu":
        return lambda x: jax.nn.gelu(x, approximate=False)
    if name == "relu":
        return jax.nn.relu
    raise ValueError(f"unknown activation {name!r}; expected one of {ACTIVATIONS}")


@jax.custom_vjp
def add_vocab_bias(logits: jax.Array, bias: jax.Array) -> jax.Array:
    """``logits + bias`` for <float32>[..., V] logits and a <float32>[V] bias.

    Only the gradient differs from ``+``: the bias gradient is taken as a ones-vector matmul
    (a GEMV) instead of XLA:CPU's column reduction over the [B*P, V] logit gradient, which was
    ~0.2 s of a 30522-vocab training step (W2 of the benchmarks); same sum, same dtype.
    """
    return logits + bias


def _add_vocab_bias_fwd(logits, bias):
    return logits + bias, jnp.zeros((0,), bias.dtype)


def _add_vocab_bias_bwd(bias_dtype_carrier, grad):
    rows = grad.reshape(-1, grad.shape[-1])
    ones = jnp.ones((rows.shape[0],), rows.dtype)
    return grad, jnp.dot(ones, rows).astype(bias_dtype_carrier.dtype)


add_vocab_bias.defvjp(_add_vocab_bias_fwd, _add_vocab_bias_bwd)


def _flat_dense_dots() -> bool:
    """Whether :class:`Dense` runs its XLA dot as one 2-D GEMM (reshaped operands): on CPU.

    XLA:CPU ran the same BERT step with 6-16% less CPU time (W1/W2/W3, docs/benchmarks.md) with
    the projections as ``[tokens, in] x [in, out]`` than as ``dot_general`` on the multi-dim
    ``[B, L, N, D]`` / ``[H, N, D]`` forms; TPU/GPU keep ``dot_general``, whose layouts their
    compilers handle natively. Both forms are tested to agree (tests/model_test.py).
    """
    return jax.default_backend() == "cpu"


class Dense(nn.Module):
    """``y = x · kernel + bias`` contracting the last ``contract_dims`` dims of ``x``.

    Written with ``self.param`` + ``dot_general`` instead of ``nn.DenseGeneral`` so every kernel and
    bias carries logical axes (``kernel_axes`` = input axes + output axes) and works under
    ``jax.set_mesh`` with multi-dimensional features. On CPU the dot is one 2-D GEMM over
    reshaped operands (:func:`_flat_dense_dots`), through the MKL kernel with ``matmul='blas'``.
    """

    features: tuple[int, ...]
    kernel_axes: tuple[str | None, ...]
    config: BertConfig
    contract_dims: int = 1

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        in_shape = x.shape[x.ndim - self.contract_dims :]
        kernel = self.param(
            "kernel",
            _init(cfg, self.kernel_axes),
            in_shape + tuple(self.features),
            _dtype(cfg.param_dtype),
        )
        bias_axes = self.kernel_axes[self.contract_dims :]
        bias = self.param(
            "bias",
            nn.with_logical_partitioning(nn.initializers.zeros, bias_axes),
            tuple(self.features),
            _dtype(cfg.param_dtype),
        )
        x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=_dtype(cfg.dtype))
        if cfg.matmul == "blas" or _flat_dense_dots():
            batch_shape, contracted = x.shape[: x.ndim - self.contract_dims], math.prod(in_shape)
            gemm = cpu_gemm.dot if cfg.matmul == "blas" else jnp.dot
            y = gemm(x.reshape(-1, contracted), kernel.reshape(contracted, -1))
            return y.reshape(*batch_shape, *self.features) + bias
        x_dims = tuple(range(x.ndim - self.contract_dims, x.ndim))
        y = jax.lax.dot_general(x, kernel, ((x_dims, tuple(range(self.contract_dims))), ((), ())))
        return y + bias


def _mix32(x: jax.Array) -> jax.Array:
    """A bijective 32-bit integer hash with full avalanche (the "lowbias32" constants)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def dropout_keep_mask(seed: jax.Array, rate: float, shape: tuple[int, ...]):
    """Bernoulli(1 - rate) keep mask <bool>[shape] from a counter hash, and the rescale factor.

    ``seed`` is <uint32>[2] (drawn once per call from the ``'dropout'`` stream). Element
    ``(row, col)`` (``row`` = flat index of the leading dims, ``col`` = last dim) is kept when
    ``mix(mix(row ^ s0) + col * golden + s1) >= rate * 2**32``. Unlike threefry (the dominant
    cost of dropout on CPU, and kept as a mask for the backward pass), this is a few integer
    ops on ``iota`` that XLA fuses into the consumer; :func:`dropout` recomputes it in the
    backward pass, so no mask is ever stored. The keep probability is quantised to 2**-32 and
    the rescale uses the exact quantised value, so ``E[mask * scale] == 1``. The mask depends
    on global positions only, so it is the same however the array is sharded.
    """
    threshold = min(int(round(rate * 2**32)), 2**32 - 1)
    if threshold == 0:
        return None, 1.0
    shape = tuple(shape) or (1,)
    rank = len(shape)
    row = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for dim in range(rank - 2, -1, -1):
        index = jax.lax.broadcasted_iota(jnp.uint32, shape, dim)
        row = row + index * jnp.uint32(stride % 2**32)
        stride *= shape[dim]
    col = jax.lax.broadcasted_iota(jnp.uint32, shape, rank - 1)
    bits = _mix32(_mix32(row ^ seed[0]) + col * jnp.uint32(0x9E3779B9) + seed[1])
    return bits >= jnp.uint32(threshold), 2**32 / (2**32 - threshold)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def dropout(x: jax.Array, seed: jax.Array, rate: float) -> jax.Array:
    """Inverted dropout of ``x`` with the mask of :func:`dropout_keep_mask`(seed, rate)."""
    keep, scale = dropout_keep_mask(seed, rate, x.shape)
    if keep is None:
        return x
    return jnp.where(keep, x * jnp.asarray(scale, x.dtype), jnp.zeros((), x.dtype))


def _dropout_fwd(x, seed, rate):
    return dropout(x, seed, rate), seed


def _dropout_bwd(rate, seed, grad):
    # The mask is recomputed (fused, a few integer ops) instead of saved; the seed gets no
    # gradient (float0 for an integer input).
    return dropout(grad, seed, rate), np.zeros(seed.shape, jax.dtypes.float0)


dropout.defvjp(_dropout_fwd, _dropout_bwd)


class Dropout(nn.Module):
    """Inverted dropout with a counter-hash mask (see :func:`dropout_keep_mask`).

    Same contract as ``nn.Dropout``: uses the ``'dropout'`` rng stream (one key per call, turned
    into a <uint32>[2] seed), no parameters.
    """

    rate: float

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        if deterministic or self.rate == 0.0:
            return x
        seed = jax.random.bits(self.make_rng("dropout"), (2,), jnp.uint32)
        return dropout(x, seed, self.rate)


def layer_norm(config: BertConfig, name: str) -> nn.LayerNorm:
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps,
        dtype=_dtype(config.dtype),
        param_dtype=_dtype(config.param_dtype),
        scale_init=nn.with_logical_partitioning(nn.initializers.ones, (sh.EMBED,)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (sh.EMBED,)),
        name=name,
    )


class Embeddings(nn.Module):
    """Token + learned position + segment embeddings, LayerNorm, dropout."""

    config: BertConfig

    def setup(self):
        cfg = self.config
        embed = lambda n, axes, name: nn.Embed(
            n,
            cfg.hidden_size,
            dtype=_dtype(cfg.dtype),
            param_dtype=_dtype(cfg.param_dtype),
            embedding_init=_init(cfg, axes),
            name=name,
        )
        self.word_embeddings = embed(cfg.vocab_size, (sh.VOCAB, sh.EMBED), "word_embeddings")
        self.position_embeddings = embed(
            cfg.max_position_embeddings, (None, sh.EMBED), "position_embeddings"
        )
        self.token_type_embeddings = embed(
            cfg.type_vocab_size, (None, sh.EMBED), "token_type_embeddings"
        )
        self.layer_norm = layer_norm(cfg, "layer_norm")
        self.dropout = Dropout(cfg.hidden_dropout_rate)

    def __call__(self, input_ids, segment_ids, deterministic: bool) -> jax.Array:
        """<int32>[B, L] ids and segment ids -> <dtype>[B, L, H]."""
        length = input_ids.shape[1]
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(jnp.arange(length)[None, :])
            + self.token_type_embeddings(segment_ids)
        )
        x = self.layer_norm(x)
        x = self.dropout(x, deterministic=deterministic)
        return nn.with_logical_constraint(x, (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_EMBED))

    def attend(self, x: jax.Array) -> jax.Array:
        """Tied decoder: <dtype>[..., H] -> <dtype>[..., V] logits against the token embedding."""
        if self.config.matmul == "blas":
            embedding = self.word_embeddings.embedding  # <V, H>
            logits = cpu_gemm.dot(x.reshape(-1, x.shape[-1]), embedding, trans_b=True)
            return logits.reshape(*x.shape[:-1], embedding.shape[0])
        return self.word_embeddings.attend(x)


class SelfAttention(nn.Module):
    config: BertConfig

    @nn.compact
    def __call__(self, x, attention_bias, deterministic: bool, query_positions=None):
        """<dtype>[B, L, H], <float32>[B, 1, 1 or L, L] -> <dtype>[B, Q, H].

        Queries are every position (Q = L), or only ``query_positions`` <int32>[B, Q] (keys and
        values are always every position).
        """
        cfg = self.config
        qkv_axes = (sh.EMBED, sh.HEADS, sh.KV)
        features = (cfg.num_heads, cfg.head_dim)
        length_axis = sh.ACT_LENGTH
        queries_in = x
        if query_positions is not None:
            length_axis = None  # Q positions, not the sequence: never sharded
            queries_in = gather_positions(x, query_positions)
            if attention_bias.shape[2] != 1:  # per-query rows (causal): keep the queries' rows
                attention_bias = jnp.take_along_axis(
                    attention_bias, query_positions[:, None, :, None], axis=2
                )
        query = Dense(features, qkv_axes, cfg, name="query")(queries_in)  # [B, Q, N, D]
        key = Dense(features, qkv_axes, cfg, name="key")(x)  # [B, L, N, D]
        value = Dense(features, qkv_axes, cfg, name="value")(x)
        query = query / jnp.sqrt(cfg.head_dim).astype(query.dtype)
        logits = jnp.einsum("bqnd,bknd->bnqk", query, key)  # [B, N, Q, L]
        logits = nn.with_logical_constraint(logits, (sh.ACT_BATCH, sh.ACT_HEADS, length_axis, None))
        # Softmax with the normalisation applied after the value product: dropout and the
        # product are linear in the probabilities, so dividing [B, Q, N, D] by the row sums
        # equals dividing [B, N, Q, L] first, and saves a full pass over the scores (and its
        # backward) — the largest activations at length 512.
        logits = logits.astype(jnp.float32) + attention_bias
        unnormalized = jnp.exp(logits - jax.lax.stop_gradient(logits.max(-1, keepdims=True)))
        row_sums = unnormalized.sum(-1)  # <float32>[B, N, Q]
        unnormalized = Dropout(cfg.attention_dropout_rate)(
            unnormalized.astype(_dtype(cfg.dtype)), deterministic=deterministic
        )
        context = jnp.einsum("bnqk,bknd->bqnd", unnormalized, value)  # [B, Q, N, D]
        inverse = jnp.transpose(1.0 / row_sums, (0, 2, 1))[..., None]  # [B, Q, N, 1]
        context = context * inverse.astype(context.dtype)
        context = nn.with_logical_constraint(
            context, (sh.ACT_BATCH, length_axis, sh.ACT_HEADS, None)
        )
        return Dense(
            (cfg.hidden_size,), (sh.HEADS, sh.KV, sh.EMBED), cfg, contract_dims=2, name="output"
        )(context)


class EncoderLayer(nn.Module):
    """One post-LayerNorm transformer layer: x = LN(x + Attn(x)); x = LN(x + FFN(x)).

    With ``query_positions`` <int32>[B, Q] everything after the key/value projections runs at
    those positions only and the output is <dtype>[B, Q, H]: the last layer of pretraining,
    whose heads read [CLS] and the masked positions (:class:`LayerStack`).

    Returns ``(x, x if collect else None)``: the (carry, output) form ``nn.scan`` wants.
    """

    config: BertConfig
    collect: bool = False

    @nn.compact
    def __call__(self, x, attention_bias, deterministic: bool, query_positions=None):
        cfg = self.config
        length_axis = sh.ACT_LENGTH if query_positions is None else None
        act_axes = (sh.ACT_BATCH, length_axis, sh.ACT_EMBED)
        h = SelfAttention(cfg, name="attention")(x, attention_bias, deterministic, query_positions)
        h = Dropout(cfg.hidden_dropout_rate)(h, deterministic=deterministic)
        if query_positions is not None:
            x = gather_positions(x, query_positions)
        x = layer_norm(cfg, "attention_layer_norm")(x + h)
        x = nn.with_logical_constraint(x, act_axes)
        h = Dense((cfg.intermediate_size,), (sh.EMBED, sh.MLP), cfg, name="intermediate")(x)
        h = nn.with_logical_constraint(
            activation(cfg.hidden_act)(h), (sh.ACT_BATCH, length_axis, sh.ACT_MLP)
        )
        h = Dense((cfg.hidden_size,), (sh.MLP, sh.EMBED), cfg, name="output")(h)
        h = Dropout(cfg.hidden_dropout_rate)(h, deterministic=deterministic)
        x = layer_norm(cfg, "output_layer_norm")(x + h)
        x = nn.with_logical_constraint(x, act_axes)
        return x, (x if self.collect else None)


def gather_positions(x: jax.Array, positions: jax.Array) -> jax.Array:
    """<dtype>[B, L, H], <int32>[B, Q] -> <dtype>[B, Q, H] (the rows of ``x`` at ``positions``)."""
    return jnp.take_along_axis(x, positions[..., None], axis=1)


def _layer_class(config: BertConfig):
    if config.remat_policy == "none":
        return EncoderLayer
    policy = {
        "full": None,
        "dots": jax.checkpoint_policies.checkpoint_dots,
        "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    }[config.remat_policy]
    # self is argument 0, so `deterministic` is argument 3.
    return nn.remat(EncoderLayer, policy=policy, static_argnums=(3,))


class LayerStack(nn.Module):
    """``num_layers`` encoder layers, unrolled (``layer_{i}``) or scanned (``layer``, stacked)."""

    config: BertConfig

    @nn.compact
    def __call__(
        self, x, attention_bias, deterministic: bool, output_hidden_states: bool, positions=None
    ):
        """Returns the last layer <dtype>[B, L, H] and a list of each layer's output (or None).

        With ``positions`` <int32>[B, Q] the last layer's output is <dtype>[B, Q, H], at those
        positions: with ``config.computes_only_output_positions`` the last layer computes only
        them (``EncoderLayer``), else it runs at every position and they are gathered after.
        """
        cfg = self.config
        layer = _layer_class(cfg)
        gather_after = positions is not None and not cfg.computes_only_output_positions
        if cfg.scan_layers:
            scanned = nn.scan(
                layer,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast, nn.broadcast),
                length=cfg.num_layers,
                metadata_params={nn.PARTITION_NAME: sh.LAYERS},
            )
            x, stacked = scanned(cfg, collect=output_hidden_states, name="layer")(
                x, attention_bias, deterministic
            )
            outputs = [stacked[i] for i in range(cfg.num_layers)] if output_hidden_states else None
        else:
            outputs = []
            for i in range(cfg.num_layers):
                last = i == cfg.num_layers - 1 and not gather_after
                x, _ = layer(cfg, name=f"layer_{i}")(
                    x, attention_bias, deterministic, positions if last else None
                )
                outputs.append(x)
            outputs = outputs if output_hidden_states else None
        if gather_after:
            x = gather_positions(x, positions)
        return x, outputs


class EncoderOutput(NamedTuple):
    sequence_output: jax.Array  # <dtype>[B, L, H] last layer ([B, Q, H] with output_positions)
    # num_layers + 1 arrays <dtype>[B, L, H] (embeddings output first, as HF), or None.
    hidden_states: tuple[jax.Array, ...] | None


def attention_bias(input_mask: jax.Array, causal: bool) -> jax.Array:
    """<int32>[B, L] mask (1 = real token) -> additive <float32>[B, 1, 1 or L, L] bias."""
    allowed = input_mask[:, None, None, :].astype(bool)
    if causal:
        length = input_mask.shape[1]
        allowed = allowed & jnp.tril(jnp.ones((length, length), bool))[None, None]
    return jnp.where(allowed, 0.0, _MASK_VALUE).astype(jnp.float32)


class BertEncoder(nn.Module):
    """Embeddings + ``num_layers`` encoder layers. No pooler (see ``heads.Pooler``)."""

    config: BertConfig

    def setup(self):
        self.embeddings = Embeddings(self.config, name="embeddings")
        self.layers = LayerStack(self.config, name="layers")

    def __call__(
        self,
        input_ids,
        segment_ids,
        input_mask,
        *,
        deterministic: bool = True,
        output_hidden_states: bool = False,
        output_positions: jax.Array | None = None,
    ) -> EncoderOutput:
        """<int32>[B, L] input_ids, segment_ids, input_mask -> EncoderOutput.

        ``output_positions`` <int32>[B, Q]: the sequence output only at these positions,
        <dtype>[B, Q, H]; with ``config.computes_only_output_positions`` the last layer then
        computes only them.
        """
        cfg = self.config
        if output_positions is not None and output_hidden_states:
            raise ValueError("output_positions and output_hidden_states cannot be combined")
        if input_ids.shape[1] > cfg.max_position_embeddings:
            raise ValueError(
                f"sequence length {input_ids.shape[1]} exceeds "
                f"max_position_embeddings={cfg.max_position_embeddings}"
            )
        bias = attention_bias(input_mask, causal=cfg.attention == "causal")
        first = self.embeddings(input_ids, segment_ids, deterministic)
        x, outputs = self.layers(first, bias, deterministic, output_hidden_states, output_positions)
        return EncoderOutput(x, (first, *outputs) if output_hidden_states else None)

    def attend(self, x: jax.Array) -> jax.Array:
        return self.embeddings.attend(x)


def stack_layers(encoder_params: dict, num_layers: int) -> dict:
    """Unscanned encoder params (``layers/layer_{i}``) -> scanned (``layers/layer``, stacked)."""
    per_layer = [encoder_params["layers"][f"layer_{i}"] for i in range(num_layers)]
    stacked = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *per_layer)
    return {**encoder_params, "layers": {"layer": stacked}}


def unstack_layers(encoder_params: dict, num_layers: int) -> dict:
    """Scanned encoder params (``layers/layer``) -> unscanned ``layers/layer_{i}`` layout."""
    stacked = encoder_params["layers"]["layer"]
    layers = {f"layer_{i}": jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(num_layers)}
    return {**encoder_params, "layers": layers}


def count_params(params) -> int:
    return sum(math.prod(x.shape) for x in jax.tree.leaves(params))
