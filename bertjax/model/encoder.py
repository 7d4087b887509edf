"""The BERT encoder (Devlin et al., 2018) as pure-functional Flax linen modules.

The model only ever sees its frozen ``BertConfig`` (``bertjax.model.config``), never the run
config. Attention itself is ``bertjax.model.attention``; heads (pooler, MLM, NSP, task heads) are
``heads.py`` and losses ``losses.py``.

Parameter tree of :class:`BertEncoder` (shapes for hidden H, heads N, head dim D = H / N,
intermediate F, vocab V, positions P, segment types T), with the logical axes of
``bertjax.model.axes``::

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

``architecture='modernbert'`` (HF's ``ModernBertModel``) keeps these names where a weight means
the same (word embeddings, ``attention/{query,key,value,output}``, ``intermediate``, ``output``)
and has no position or segment embeddings, no biases unless its config asks, its layers'
``attention_norm`` (not layer 0's) and ``mlp_norm`` before each block, ``intermediate/kernel
<H, 2, F>`` (the GLU's input and gate halves) and ``final_norm`` (:class:`ModernEncoderLayer`;
``bertjax.interop.modernbert`` maps every name to HF's).

With ``scan_layers=True`` the ``layer_{i}`` subtrees are stacked into one ``layers/layer`` subtree
whose leaves have a leading ``<num_layers>`` dimension with logical axis ``layers``;
:func:`stack_layers` / :func:`unstack_layers` convert between the two layouts.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bertjax.model import attention as attention_lib
from bertjax.model import axes as sh
from bertjax.model import cpu_forms, rope
from bertjax.model.attention.dropout import Dropout
from bertjax.model.config import ACTIVATIONS, BertConfig


def _dtype(name: str):
    return jnp.dtype(name)


def _init(config: BertConfig, axes, scale: float = 1.0):
    # The original code initialises every weight from a truncated normal(0, initializer_range),
    # cut at 2 std as HF ModernBERT's; ModernBERT scales its output projections' std (``scale``).
    return nn.with_logical_partitioning(
        nn.initializers.truncated_normal(config.initializer_range * scale), axes
    )


def activation(name: str):
    if name == "gelu_tanh":
        return lambda x: jax.nn.gelu(x, approximate=True)
    if name == "gelu":
        return lambda x: jax.nn.gelu(x, approximate=False)
    if name == "relu":
        return jax.nn.relu
    raise ValueError(f"unknown activation {name!r}; expected one of {ACTIVATIONS}")


class Dense(nn.Module):
    """``y = x · kernel + bias`` contracting the last ``contract_dims`` dims of ``x``.

    Written with ``self.param`` + ``dot_general`` instead of ``nn.DenseGeneral`` so every kernel and
    bias carries logical axes (``kernel_axes`` = input axes + output axes) and works under
    ``jax.set_mesh`` with multi-dimensional features. With ``config.cpu_forms`` the dot is
    :func:`bertjax.model.cpu_forms.dense_dot`'s 2-D GEMM.
    """

    features: tuple[int, ...]
    kernel_axes: tuple[str | None, ...]
    config: BertConfig
    contract_dims: int = 1
    use_bias: bool = True
    init_scale: float = 1.0  # the kernel's init std, in units of config.initializer_range

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        in_shape = x.shape[x.ndim - self.contract_dims :]
        kernel = self.param(
            "kernel",
            _init(cfg, self.kernel_axes, self.init_scale),
            in_shape + tuple(self.features),
            _dtype(cfg.param_dtype),
        )
        if not self.use_bias:
            x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=_dtype(cfg.dtype))
            return cpu_forms.dense_dot(x, kernel, self.contract_dims, cfg.cpu_forms)
        bias_axes = self.kernel_axes[self.contract_dims :]
        bias = self.param(
            "bias",
            nn.with_logical_partitioning(nn.initializers.zeros, bias_axes),
            tuple(self.features),
            _dtype(cfg.param_dtype),
        )
        x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=_dtype(cfg.dtype))
        return cpu_forms.dense_dot(x, kernel, self.contract_dims, cfg.cpu_forms) + bias


def layer_norm(config: BertConfig, name: str) -> nn.LayerNorm:
    """The LayerNorm of every layer and head: with a bias unless ``config.bias('norm')`` is off."""
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps,
        use_bias=config.bias("norm"),
        dtype=_dtype(config.dtype),
        param_dtype=_dtype(config.param_dtype),
        scale_init=nn.with_logical_partitioning(nn.initializers.ones, (sh.EMBED,)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (sh.EMBED,)),
        name=name,
    )


class Embeddings(nn.Module):
    """Token + learned position + segment embeddings, LayerNorm, dropout; for 'modernbert' the
    token embeddings alone (its positions are rotary, in the attention), LayerNorm, dropout."""

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
        if not cfg.is_modern:
            self.position_embeddings = embed(
                cfg.max_position_embeddings, (None, sh.EMBED), "position_embeddings"
            )
            self.token_type_embeddings = embed(
                cfg.type_vocab_size, (None, sh.EMBED), "token_type_embeddings"
            )
        self.layer_norm = layer_norm(cfg, "layer_norm")
        self.dropout = Dropout(cfg.hidden_dropout_rate)

    def __call__(self, input_ids, segment_ids, deterministic: bool, positions=None) -> jax.Array:
        """<int32>[B, L] ids and segment ids -> <dtype>[B, L, H]; ``positions`` <int32>[B, L]:
        each token's position id (a packed row's restart at each instance), else 0..L-1."""
        if self.config.is_modern:
            x = self.word_embeddings(input_ids)
        else:
            if positions is None:
                positions = jnp.arange(input_ids.shape[1])[None, :]
            x = (
                self.word_embeddings(input_ids)
                + self.position_embeddings(positions)
                + self.token_type_embeddings(segment_ids)
            )
        x = self.layer_norm(x)
        x = self.dropout(x, deterministic=deterministic)
        return nn.with_logical_constraint(x, (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_EMBED))

    def attend(self, x: jax.Array) -> jax.Array:
        """Tied decoder: <dtype>[..., H] -> <dtype>[..., V] logits against the token embedding."""
        return self.word_embeddings.attend(x)


class SelfAttention(nn.Module):
    """Multi-head self-attention; for 'modernbert' with RoPE on queries and keys (base
    ``config.rope_theta(layer)``) and, on local layers, ``config.window(layer)``."""

    config: BertConfig
    layer: int = 0

    @nn.compact
    def __call__(
        self, queries_in, x, input_mask, deterministic: bool, query_positions=None, rope_ids=None
    ):
        """<dtype>[B, Q, H] query inputs, <dtype>[B, L, H] key/value inputs, <int32>[B, L] input
        mask -> <dtype>[B, Q, H].

        ``queries_in`` is ``x`` (Q = L), or its rows at ``query_positions`` <int32>[B, Q]
        (:class:`EncoderLayer` gathers them). ``rope_ids`` <int32>[B, L]: the keys' position ids
        for RoPE ('modernbert' only).
        """
        cfg = self.config
        qkv_axes = (sh.EMBED, sh.HEADS, sh.KV)
        features = (cfg.num_heads, cfg.head_dim)
        length_axis = sh.ACT_LENGTH if query_positions is None else None  # Q: never sharded
        bias = cfg.bias("attention")
        query = Dense(features, qkv_axes, cfg, use_bias=bias, name="query")(queries_in)
        key = Dense(features, qkv_axes, cfg, use_bias=bias, name="key")(x)  # [B, L, N, D]
        value = Dense(features, qkv_axes, cfg, use_bias=bias, name="value")(x)
        if cfg.is_modern:
            theta = cfg.rope_theta(self.layer)
            query_ids = rope_ids if query_positions is None else (
                jnp.take_along_axis(rope_ids, query_positions, axis=1)
            )  # fmt: skip
            query = rope.rotate(query, query_ids, theta)
            key = rope.rotate(key, rope_ids, theta)
        query = query / jnp.sqrt(cfg.head_dim).astype(query.dtype)
        seed = None
        if not deterministic and cfg.attention_dropout_rate > 0.0:
            seed = jax.random.bits(self.make_rng("dropout"), (2,), jnp.uint32)
        context = attention_lib.attention(
            query,
            key,
            value,
            input_mask,
            causal=cfg.attention == "causal",
            query_positions=query_positions,
            dropout_rate=cfg.attention_dropout_rate,
            dropout_seed=seed,
            kernel=cfg.attention_impl,
            window=cfg.window(self.layer),
        )
        context = nn.with_logical_constraint(
            context, (sh.ACT_BATCH, length_axis, sh.ACT_HEADS, None)
        )
        return Dense(
            (cfg.hidden_size,), (sh.HEADS, sh.KV, sh.EMBED), cfg, contract_dims=2,
            use_bias=bias, init_scale=cfg.output_init_scale, name="output",
        )(context)  # fmt: skip


class EncoderLayer(nn.Module):
    """One post-LayerNorm transformer layer: x = LN(x + Attn(x)); x = LN(x + FFN(x)).

    With ``query_positions`` <int32>[B, Q] everything after the key/value projections runs at
    those positions only and the output is <dtype>[B, Q, H]: the last layer of pretraining,
    whose heads read [CLS] and the masked positions (:class:`LayerStack`).

    Returns ``(x, x if collect else None)``: the (carry, output) form ``nn.scan`` wants.
    """

    config: BertConfig
    collect: bool = False
    layer: int = 0

    @nn.compact
    def __call__(self, x, input_mask, deterministic: bool, query_positions=None, rope_ids=None):
        cfg = self.config
        length_axis = sh.ACT_LENGTH if query_positions is None else None
        act_axes = (sh.ACT_BATCH, length_axis, sh.ACT_EMBED)
        # The one gather of the gathered last layer: its queries and residual stream.
        queries_in = x if query_positions is None else gather_positions(x, query_positions)
        h = SelfAttention(cfg, self.layer, name="attention")(
            queries_in, x, input_mask, deterministic, query_positions
        )
        h = Dropout(cfg.hidden_dropout_rate)(h, deterministic=deterministic)
        x = layer_norm(cfg, "attention_layer_norm")(queries_in + h)
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


class ModernEncoderLayer(nn.Module):
    """One 'modernbert' layer, pre-LayerNorm: x = x + Attn(LN(x)); x = x + MLP(LN(x)), where
    layer 0 has no norm before its attention (the embeddings end in one) and the MLP is a GLU,
    ``output(act(a) * g)`` with ``(a, g)`` the two halves of ``intermediate`` (HF's ``Wi`` ->
    ``chunk(2)``). Its parameters (no biases unless the config's flags ask)::

        attention_norm/scale <H>   (not in layer_0)     mlp_norm/scale <H>
        attention/{query,key,value,output}/kernel        as EncoderLayer's
        intermediate/kernel <H, 2, F> (embed, None, mlp)  output/kernel <F, H> (mlp, embed)

    Dropout: ``attention_dropout_rate`` on the probabilities and on the attention output (HF's
    ``out_drop``), ``hidden_dropout_rate`` on the GLU's output (HF's ``mlp_dropout``). Arguments
    and ``query_positions`` as :class:`EncoderLayer`'s; ``rope_ids`` <int32>[B, L]: position ids.
    """

    config: BertConfig
    collect: bool = False
    layer: int = 0

    @nn.compact
    def __call__(self, x, input_mask, deterministic: bool, query_positions=None, rope_ids=None):
        cfg = self.config
        length_axis = sh.ACT_LENGTH if query_positions is None else None
        act_axes = (sh.ACT_BATCH, length_axis, sh.ACT_EMBED)
        normed = x if self.layer == 0 else layer_norm(cfg, "attention_norm")(x)
        gathered = query_positions is not None
        queries_in = gather_positions(normed, query_positions) if gathered else normed
        h = SelfAttention(cfg, self.layer, name="attention")(
            queries_in, normed, input_mask, deterministic, query_positions, rope_ids
        )
        h = Dropout(cfg.attention_dropout_rate)(h, deterministic=deterministic)
        x = (gather_positions(x, query_positions) if gathered else x) + h
        x = nn.with_logical_constraint(x, act_axes)
        h = Dense(
            (2, cfg.intermediate_size), (sh.EMBED, None, sh.MLP), cfg,
            use_bias=cfg.bias("mlp"), name="intermediate",
        )(layer_norm(cfg, "mlp_norm")(x))  # fmt: skip
        h = activation(cfg.hidden_act)(h[..., 0, :]) * h[..., 1, :]
        h = nn.with_logical_constraint(h, (sh.ACT_BATCH, length_axis, sh.ACT_MLP))
        h = Dropout(cfg.hidden_dropout_rate)(h, deterministic=deterministic)
        h = Dense(
            (cfg.hidden_size,), (sh.MLP, sh.EMBED), cfg, use_bias=cfg.bias("mlp"),
            init_scale=cfg.output_init_scale, name="output",
        )(h)  # fmt: skip
        x = nn.with_logical_constraint(x + h, act_axes)
        return x, (x if self.collect else None)


def gather_positions(x: jax.Array, positions: jax.Array) -> jax.Array:
    """<dtype>[B, L, H], <int32>[B, Q] -> <dtype>[B, Q, H] (the rows of ``x`` at ``positions``)."""
    return jnp.take_along_axis(x, positions[..., None], axis=1)


def _layer_class(config: BertConfig):
    base = ModernEncoderLayer if config.is_modern else EncoderLayer
    if config.remat_policy == "none":
        return base
    policies = jax.checkpoint_policies
    kernel_outputs = policies.save_only_these_names(*attention_lib.CHECKPOINT_NAMES)
    policy = {
        "full": None,
        "dots": policies.checkpoint_dots,
        "dots_no_batch": policies.dots_with_no_batch_dims_saveable,
        "dots_attention": policies.save_from_both_policies(
            policies.dots_with_no_batch_dims_saveable, kernel_outputs
        ),
        "attention": kernel_outputs,
    }[config.remat_policy]
    # self is argument 0, so `deterministic` is argument 3.
    return nn.remat(base, policy=policy, static_argnums=(3,))


class LayerStack(nn.Module):
    """``num_layers`` encoder layers, unrolled (``layer_{i}``) or scanned (``layer``, stacked)."""

    config: BertConfig

    @nn.compact
    def __call__(
        self,
        x,
        input_mask,
        deterministic: bool,
        output_hidden_states: bool,
        positions=None,
        rope_ids=None,
    ):
        """Returns the last layer <dtype>[B, L, H] and a list of each layer's output (or None).
        ``rope_ids`` <int32>[B, L]: the tokens' position ids, for 'modernbert' layers' RoPE.

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
                x, input_mask, deterministic
            )
            outputs = [stacked[i] for i in range(cfg.num_layers)] if output_hidden_states else None
        else:
            outputs = []
            for i in range(cfg.num_layers):
                last = i == cfg.num_layers - 1 and not gather_after
                x, _ = layer(cfg, layer=i, name=f"layer_{i}")(
                    x, input_mask, deterministic, positions if last else None, rope_ids
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


class BertEncoder(nn.Module):
    """Embeddings + ``num_layers`` encoder layers (+ ``final_norm/scale <H>`` for 'modernbert',
    applied to the sequence output; ``hidden_states`` are the layers' outputs before it, as HF's).
    No pooler (see ``heads.Pooler``)."""

    config: BertConfig

    def setup(self):
        self.embeddings = Embeddings(self.config, name="embeddings")
        self.layers = LayerStack(self.config, name="layers")
        if self.config.is_modern:
            self.final_norm = layer_norm(self.config, "final_norm")

    def __call__(
        self,
        input_ids,
        segment_ids,
        input_mask,
        *,
        deterministic: bool = True,
        output_hidden_states: bool = False,
        output_positions: jax.Array | None = None,
        positions: jax.Array | None = None,
    ) -> EncoderOutput:
        """<int32>[B, L] input_ids, segment_ids, input_mask -> EncoderOutput.

        ``input_mask`` is the attention's key mask: 1 on real tokens, 0 on padding, or a packed
        row's ``sequence_ids`` (1..k per instance; ``bertjax.data.pipeline``'s packed row), with
        which each instance attends only to itself. ``positions`` <int32>[B, L]: position ids
        (a packed row's restart at 0 per instance); None: 0..L-1.
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
        first = self.embeddings(input_ids, segment_ids, deterministic, positions)
        rope_ids = None
        if cfg.is_modern:
            rope_ids = positions
            if rope_ids is None:
                rope_ids = jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
        x, outputs = self.layers(
            first, input_mask, deterministic, output_hidden_states, output_positions, rope_ids
        )
        if cfg.is_modern:
            length_axis = sh.ACT_LENGTH if output_positions is None else None
            x = self.final_norm(x)
            x = nn.with_logical_constraint(x, (sh.ACT_BATCH, length_axis, sh.ACT_EMBED))
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
