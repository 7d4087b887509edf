"""The feature-based approach's head (paper §5.3, Table 7): frozen encoder activations, combined,
read by a BiLSTM, scored by the task's classifier.

The encoder's hidden states are ``h_0`` (the embeddings' output, after their LayerNorm: HF's
``hidden_states[0]``) and ``h_1 .. h_N`` (the outputs of the N layers); a combination is one of:

    embeddings          h_0
    second_to_last      h_{N-1}
    last                h_N
    last_four_sum       γ · Σ_{j=N-3..N} softmax(s)_j · h_j       (learned s <4>, γ; ELMo's mix)
    last_four_concat    [h_{N-3}; h_{N-2}; h_{N-1}; h_N]          <4H> per token
    all_sum             γ · Σ_{j=1..N} softmax(s)_j · h_j         (the N layers, not h_0)

The paper does not say how its weighted sums are weighted; here they are ELMo's scalar mix
(Peters et al., 2018), the feature-based model the paper compares with: weights ``s`` initialised
to 0 (an even mean at the start) and a scale ``γ`` initialised to 1, both trained with the head.
"All layers" are BERT-BASE's 12 Transformer layers in the paper's table, so ``all_sum`` leaves out
the embeddings. An encoder of fewer than 4 layers has fewer "last four" (all N of them), and one
of 1 layer has the embeddings as its second-to-last.

Parameter tree of :class:`FeatureHead` (J combined states of H units, R BiLSTM units)::

    layer_mix/{weights <J>, scale <>}   only for the *_sum combinations
    bilstm/...                          bertjax.model.bilstm (layer 0 reads H, or 4H for concat)
    classifier/dense/{kernel <2R, C>, bias <C>}
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.model.bilstm import BiLSTM, BiLSTMConfig
from bertjax.model.config import BertConfig
from bertjax.model.heads import ClassificationOutput

COMBINATIONS = (
    "embeddings",
    "second_to_last",
    "last",
    "last_four_sum",
    "last_four_concat",
    "all_sum",
)


def hidden_state_indices(combination: str, num_layers: int) -> tuple[int, ...]:
    """The hidden states ``combination`` reads, as indexes of ``EncoderOutput.hidden_states``
    (0: the embeddings' output, j: layer j's), shallowest first."""
    last_four = tuple(range(max(num_layers - 3, 1), num_layers + 1))
    indices = {
        "embeddings": (0,),
        "second_to_last": (max(num_layers - 1, 0),),
        "last": (num_layers,),
        "last_four_sum": last_four,
        "last_four_concat": last_four,
        "all_sum": tuple(range(1, num_layers + 1)),
    }
    if combination not in indices:
        raise ValueError(f"layer combination {combination!r}: expected one of {COMBINATIONS}")
    return indices[combination]


class LayerMix(nn.Module):
    """ELMo's scalar mix: <float32>[B, J, L, H] -> γ · Σ_j softmax(s)_j · h_j <float32>[B, L, H]."""

    @nn.compact
    def __call__(self, layers: jax.Array) -> jax.Array:
        weights = self.param(
            "weights",
            nn.with_logical_partitioning(nn.initializers.zeros, (None,)),
            (layers.shape[1],),
            jnp.float32,
        )
        scale = self.param(
            "scale", nn.with_logical_partitioning(nn.initializers.ones, ()), (), jnp.float32
        )
        return scale * jnp.einsum("j,bjlh->blh", jax.nn.softmax(weights), layers)


def combine(combination: str, layers: jax.Array, mix: LayerMix | None = None) -> jax.Array:
    """The combination of <float32>[B, J, L, H] (the states of :func:`hidden_state_indices`,
    in its order) -> <float32>[B, L, H], or [B, L, J·H] for a concatenation."""
    if combination.endswith("_sum"):
        return mix(layers)
    if combination.endswith("_concat"):
        batch, count, length, hidden = layers.shape
        return jnp.moveaxis(layers, 1, 2).reshape(batch, length, count * hidden)
    return layers[:, 0]


class FeatureHead(nn.Module):
    """A combination of frozen activations, a BiLSTM, the task's classifier -> logits: per token
    <float32>[B, L, C] (tagging), or of the BiLSTM's final states <float32>[B, C] (sentences)."""

    config: BertConfig  # the encoder's: dtype, initializer_range, hidden_dropout_rate
    combination: str
    rnn: BiLSTMConfig
    num_labels: int
    per_token: bool

    @nn.compact
    def __call__(self, layers, input_mask, *, deterministic: bool = True) -> jax.Array:
        """<float32>[B, J, L, H] activations, <int32>[B, L] input mask -> logits."""
        mix = LayerMix(name="layer_mix") if self.combination.endswith("_sum") else None
        x = combine(self.combination, layers, mix).astype(jnp.dtype(self.config.dtype))
        outputs, final = BiLSTM(self.config, self.rnn, name="bilstm")(x, input_mask)
        classifier = ClassificationOutput(self.config, self.num_labels, name="classifier")
        return classifier(outputs if self.per_token else final, deterministic)
