"""A bidirectional LSTM over encoder states: the paper's BiLSTM baselines (Devlin et al., 2018).

Table 5's "LTR & No NSP + BiLSTM" puts a randomly initialised BiLSTM on the encoder for
fine-tuning (the task models of ``bertjax.model.heads`` with ``rnn``); Table 7's feature-based
approach trains a two-layer BiLSTM on frozen activations (``bertjax.model.feature_head``). Both
are :class:`BiLSTM`: Flax's own ``nn.RNN`` over ``nn.OptimizedLSTMCell``, in ``nn.Bidirectional``.

Parameter tree (R units per direction; layer 0 reads D features, every later layer the 2R of
the one below), with the logical axes of ``bertjax.model.axes``::

    layer_{i}/{forward_rnn,backward_rnn}/cell/{ii,if,ig,io}/kernel  <D | 2R, R>  (embed | None, rnn)
    layer_{i}/{forward_rnn,backward_rnn}/cell/{hi,hf,hg,ho}/kernel  <R, R>       (None, rnn)
    layer_{i}/{forward_rnn,backward_rnn}/cell/{hi,hf,hg,ho}/bias    <R>          (rnn)

The cell is ``nn.OptimizedLSTMCell`` (``nn.LSTMCell``'s math and names, its matmuls fused):
``i, f, g, o = σ, σ, tanh, σ(x·W_i* + h·W_h* + b_h*)``, ``c' = f·c + i·g``, ``h' = o·tanh(c')``;
in PyTorch's ``nn.LSTM`` terms ``weight_ih`` is the four input kernels transposed and stacked
in i, f, g, o order, ``weight_hh`` the hidden ones, ``bias_hh`` the biases and ``bias_ih`` zero
(``tests/model/bilstm_test.py`` checks it so).
Kernels are drawn as every BERT weight (truncated normal(0, initializer_range)), biases are 0:
the same draw a fine-tuning run gives a fresh head (``bertjax.finetune.inputs.init_params``).

**Masks.** Each sequence is read over its own tokens only. Flax's ``seq_lengths`` stops the
forward pass at the last real token and starts the backward pass there, so padding never
reaches a real token's output and the final states are the ones at the sequence's two ends;
outputs on padding are 0. A packed row (``bertjax.data.pipeline``'s packed row: ``sequence_ids``
1..k per instance, 0 on padding) is first cut into its K instances (:func:`instances`), each
read alone from its own first token, and the outputs are put back at the row's tokens
(:func:`to_rows`): what the instances give unpacked, at the LSTM cost of K unpacked rows (the
encoder keeps its saving).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.model import axes as sh
from bertjax.model.config import BertConfig


@dataclasses.dataclass(frozen=True)
class BiLSTMConfig:
    """A BiLSTM head's size (hashable: a module field)."""

    hidden_size: int  # R, units per direction (outputs are 2R)
    num_layers: int = 1

    def __post_init__(self):
        for field in ("hidden_size", "num_layers"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"BiLSTMConfig.{field}={value!r}: expected a positive integer")


def instances(x: jax.Array, sequence_ids: jax.Array, num_instances: int):
    """A packed row's K instances, each from its first token: <dtype>[B, L, D] and
    ``sequence_ids`` <int32>[B, L] -> (<dtype>[B, K, L, D], lengths <int32>[B, K]; an empty
    slot has length 0)."""
    batch, length = sequence_ids.shape
    slots = jnp.arange(1, num_instances + 1, dtype=sequence_ids.dtype)
    member = sequence_ids[:, None, :] == slots[None, :, None]  # [B, K, L]
    starts = jnp.argmax(member, axis=-1)  # an instance's tokens are contiguous
    index = jnp.minimum(starts[..., None] + jnp.arange(length), length - 1)  # [B, K, L]
    gathered = x[jnp.arange(batch)[:, None, None], index]
    return gathered, jnp.sum(member, axis=-1).astype(jnp.int32)


def to_rows(y: jax.Array, sequence_ids: jax.Array) -> jax.Array:
    """The instances' outputs <dtype>[B, K, L, F] back at their row's tokens: <dtype>[B, L, F],
    0 on padding (the inverse of :func:`instances`)."""
    batch, length = sequence_ids.shape
    slot = jnp.maximum(sequence_ids - 1, 0)
    is_first = jnp.arange(length) == 0
    starts_here = (sequence_ids != jnp.roll(sequence_ids, 1, axis=1)) | is_first  # [B, L]
    # Each token's offset in its instance: its index minus the index where its instance began.
    begin = jax.lax.cummax(jnp.where(starts_here, jnp.arange(length), 0), axis=1)
    out = y[jnp.arange(batch)[:, None], slot, jnp.arange(length) - begin]
    return jnp.where((sequence_ids > 0)[..., None], out, 0)


class BiLSTM(nn.Module):
    """``rnn.num_layers`` bidirectional LSTM layers of ``rnn.hidden_size`` units per direction."""

    config: BertConfig  # dtype, param_dtype and initializer_range only
    rnn: BiLSTMConfig

    def _cell(self, input_axis: str | None) -> nn.OptimizedLSTMCell:
        cfg = self.config
        draw = nn.initializers.truncated_normal(cfg.initializer_range)
        return nn.OptimizedLSTMCell(
            self.rnn.hidden_size,
            kernel_init=nn.with_logical_partitioning(draw, (input_axis, sh.RNN)),
            recurrent_kernel_init=nn.with_logical_partitioning(draw, (None, sh.RNN)),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (sh.RNN,)),
            dtype=jnp.dtype(cfg.dtype),
            param_dtype=jnp.dtype(cfg.param_dtype),
            parent=None,  # adopted by its nn.RNN: params under forward_rnn/cell, backward_rnn/cell
        )

    def read(self, x: jax.Array, lengths: jax.Array) -> tuple[jax.Array, jax.Array]:
        """<dtype>[N, T, D], <int32>[N] -> (outputs <dtype>[N, T, 2R], 0 past each length;
        final states <dtype>[N, 2R]: the forward's at the last token, the backward's at the
        first)."""
        dtype = x.dtype
        for i in range(self.rnn.num_layers):
            layer = nn.Bidirectional(
                nn.RNN(self._cell(sh.EMBED if i == 0 else None), parent=None),
                nn.RNN(self._cell(sh.EMBED if i == 0 else None), parent=None),
                return_carry=True,
                name=f"layer_{i}",
            )
            (forward, backward), x = layer(x, seq_lengths=lengths)
        real = jnp.arange(x.shape[1])[None, :] < lengths[:, None]
        outputs = jnp.where(real[..., None], x, 0).astype(dtype)
        final = jnp.concatenate([forward[1], backward[1]], axis=-1)
        return outputs, jnp.where(lengths[:, None] > 0, final, 0).astype(dtype)

    @nn.compact
    def __call__(self, x: jax.Array, input_mask: jax.Array, num_instances: int = 0):
        """<dtype>[B, L, D] and ``input_mask`` <int32>[B, L] (1 on real tokens, then 0) ->
        (outputs <dtype>[B, L, 2R], final states <dtype>[B, 2R]).

        ``num_instances`` K > 0: ``input_mask`` is a packed row's ``sequence_ids`` and every
        instance is read alone; the final states are <dtype>[B, K, 2R], one per slot (0 for an
        empty one)."""
        if not num_instances:
            lengths = jnp.sum(input_mask != 0, axis=1).astype(jnp.int32)
            return self.read(x, lengths)
        batch, length = input_mask.shape
        split, lengths = instances(x, input_mask, num_instances)
        outputs, final = self.read(
            split.reshape(batch * num_instances, length, -1), lengths.ravel()
        )
        outputs = outputs.reshape(batch, num_instances, length, -1)
        return to_rows(outputs, input_mask), final.reshape(batch, num_instances, -1)
