"""Heads on top of :class:`bertjax.model.encoder.BertEncoder` and the composite models built from
them.

Every composite model has the same top-level parameter names, so a subtree can move between
them (a pretraining checkpoint initialises a fine-tuning model by copying ``encoder`` and
``pooler``):

    encoder/...                              see bertjax.model.encoder
    pooler/dense/{kernel <H, H>, bias <H>}   tanh(dense(h[CLS]))
    mlm/transform/{kernel <H, H>, bias <H>}  dense + activation + LayerNorm on gathered positions
    mlm/layer_norm/{scale, bias} <H>
    mlm/output_bias <V>                      decoder is tied to encoder/embeddings/word_embeddings
    nsp/dense/{kernel <H, 2>, bias <2>}      IsNext / NotNext on the pooled output

Task heads (classification/regression, span, tagging, multiple choice; used by
``bertjax.finetune``) are at the end of this file and use the same ``encoder``/``pooler`` names;
their own subtrees are ``classifier/dense`` (or ``span`` for SQuAD). 'modernbert' task models are
HF's ``ModernBertFor*`` ones: no pooler; a ``head`` (``transform`` dense, activation,
``layer_norm``: ``ModernBertPredictionHead``) on the pooled state (``classifier_pooling``: [CLS]
or the mean over the example's tokens) or on every token, then dropout and ``classifier/dense``
(SQuAD's too: <H, 2>).

With ``rnn`` (a :class:`~bertjax.model.bilstm.BiLSTMConfig`: the paper's Table 5 "+ BiLSTM") a
randomly initialised BiLSTM, subtree ``bilstm`` (``bertjax.model.bilstm``), reads the encoder's
sequence output, each example over its own tokens (a packed row's instances each alone). Token
heads (tagging, span) score its outputs per token. Sentence heads (classification, regression,
choice) score the concatenation of its final forward state (after the last token) and final
backward state (after reading back to [CLS]), <[2R]>, instead of the pooled [CLS]; the pooler is
not used. The final states, not the BiLSTM's output at [CLS]: under the left-to-right model
(Table 5's row) [CLS] attends only to itself, so the forward half of its output would carry
nothing about the sentence, while the forward pass's last state has read all of it.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.model import axes as sh
from bertjax.model import cpu_forms
from bertjax.model.attention.dropout import Dropout
from bertjax.model.bilstm import BiLSTM, BiLSTMConfig
from bertjax.model.config import BertConfig
from bertjax.model.encoder import BertEncoder, Dense, activation, gather_positions, layer_norm


class Pooler(nn.Module):
    """tanh(dense(h[:, 0])): <dtype>[B, L, H] -> <dtype>[B, H]; with ``each=True``, of every
    state of <dtype>[B, K, H] (a packed row's K [CLS] states) -> <dtype>[B, K, H]."""

    config: BertConfig

    @nn.compact
    def __call__(self, sequence_output: jax.Array, each: bool = False) -> jax.Array:
        cfg = self.config
        first = sequence_output if each else sequence_output[:, 0]
        return jnp.tanh(Dense((cfg.hidden_size,), (sh.EMBED, None), cfg, name="dense")(first))


def prediction_transform(cfg: BertConfig, x: jax.Array, act: str) -> jax.Array:
    """dense ``transform`` -> ``act`` -> LayerNorm ``layer_norm``, in the calling module's scope:
    the MLM head's transform and 'modernbert''s task ``head`` (HF's ``ModernBertPredictionHead``).
    The dense has a bias unless ``cfg.bias('head')`` is off."""
    h = Dense(
        (cfg.hidden_size,), (sh.EMBED, None), cfg, use_bias=cfg.bias("head"),
        init_scale=cfg.output_init_scale, name="transform",
    )(x)  # fmt: skip
    return layer_norm(cfg, "layer_norm")(activation(act)(h))


class MaskedLMHead(nn.Module):
    """MLM logits at the masked positions only, through the decoder tied to the token embedding:
    dense -> activation -> LayerNorm -> decoder (+ output bias). 'modernbert' (HF's
    ``ModernBertPredictionHead`` + ``decoder``) takes the config's head activation and biases."""

    config: BertConfig

    @nn.compact
    def __call__(self, sequence_output, masked_lm_positions, decoder) -> jax.Array:
        """<dtype>[B, L, H], <int32>[B, P], tied decoder fn -> <float32>[B, P, V] logits.

        ``masked_lm_positions=None``: ``sequence_output`` is already <dtype>[B, P, H] at them.
        """
        cfg = self.config
        # Gather first: the transform and the V-way decoder run on [B, P, H], never [B, L, H].
        gathered = sequence_output
        if masked_lm_positions is not None:
            gathered = gather_positions(sequence_output, masked_lm_positions)
        h = prediction_transform(cfg, gathered, cfg.head_act if cfg.is_modern else cfg.hidden_act)
        logits = decoder(h).astype(jnp.float32)
        if cfg.bias("decoder"):
            bias = self.param(
                "output_bias",
                nn.with_logical_partitioning(nn.initializers.zeros, (sh.VOCAB,)),
                (cfg.vocab_size,),
                jnp.dtype(cfg.param_dtype),
            )
            add = cpu_forms.add_vocab_bias if cfg.cpu_forms else jnp.add
            logits = add(logits, bias.astype(jnp.float32))
        return nn.with_logical_constraint(logits, (sh.ACT_BATCH, None, None))


class NextSentenceHead(nn.Module):
    """<dtype>[..., H] pooled output -> <float32>[..., 2] logits (0 = IsNext, 1 = NotNext)."""

    config: BertConfig

    @nn.compact
    def __call__(self, pooled_output: jax.Array) -> jax.Array:
        return Dense((2,), (sh.EMBED, None), self.config, name="dense")(pooled_output).astype(
            jnp.float32
        )


class BertOutput(NamedTuple):
    sequence_output: jax.Array  # <dtype>[B, L, H]
    pooled_output: jax.Array  # <dtype>[B, H]
    hidden_states: tuple[jax.Array, ...] | None  # num_layers + 1 of <dtype>[B, L, H], or None


class BertModel(nn.Module):
    """Encoder + pooler; the equivalent of HF's ``BertModel``."""

    config: BertConfig

    def setup(self):
        self.encoder = BertEncoder(self.config, name="encoder")
        self.pooler = Pooler(self.config, name="pooler")

    def __call__(
        self,
        input_ids,
        segment_ids,
        input_mask,
        *,
        deterministic: bool = True,
        output_hidden_states: bool = False,
    ) -> BertOutput:
        out = self.encoder(
            input_ids,
            segment_ids,
            input_mask,
            deterministic=deterministic,
            output_hidden_states=output_hidden_states,
        )
        return BertOutput(out.sequence_output, self.pooler(out.sequence_output), out.hidden_states)


class PreTrainingOutput(NamedTuple):
    mlm_logits: jax.Array  # <float32>[B, P, V]
    nsp_logits: jax.Array  # <float32>[B, 2]; a packed batch's: [B, K, 2], one per instance


class BertForPreTraining(nn.Module):
    """Encoder + pooler + MLM + NSP heads; the equivalent of HF's ``BertForPreTraining``.

    The NSP head always exists (so checkpoints export to HF's class); the No-NSP ablation simply
    gives its loss zero weight. With ``config.gather_last_layer`` the encoder's last layer runs
    only at [CLS] and the masked positions, the only ones the heads read (same outputs).
    """

    config: BertConfig

    def setup(self):
        self.encoder = BertEncoder(self.config, name="encoder")
        self.pooler = Pooler(self.config, name="pooler")
        self.mlm = MaskedLMHead(self.config, name="mlm")
        self.nsp = NextSentenceHead(self.config, name="nsp")

    def __call__(
        self,
        input_ids,
        segment_ids,
        input_mask,
        masked_lm_positions,
        *,
        deterministic: bool = True,
        positions=None,
        cls_positions=None,
    ) -> PreTrainingOutput:
        """<int32>[B, L] x3, <int32>[B, P] -> PreTrainingOutput.

        A packed batch (``bertjax.data.pipeline``'s packed row) passes its ``sequence_ids`` as
        ``input_mask``, its ``positions``, and ``cls_positions`` <int32>[B, K], the instances'
        [CLS] positions: NSP then pools each and gives <float32>[B, K, 2].
        """
        packed = cls_positions is not None
        if not packed:
            cls_positions = jnp.zeros_like(masked_lm_positions[:, :1])
        k = cls_positions.shape[1]
        read = self.encoder(
            input_ids,
            segment_ids,
            input_mask,
            deterministic=deterministic,
            output_positions=jnp.concatenate([cls_positions, masked_lm_positions], axis=1),
            positions=positions,
        ).sequence_output  # <dtype>[B, K + P, H]: the [CLS] states, then the masked positions
        mlm_logits = self.mlm(read[:, k:], None, self.encoder.attend)
        pooled = self.pooler(read[:, :k], each=True) if packed else self.pooler(read)
        return PreTrainingOutput(mlm_logits, self.nsp(pooled))


class BertForMaskedLM(nn.Module):
    """Encoder + MLM head, no pooler or NSP: HF's ``ModernBertForMaskedLM`` (and
    ``BertForMaskedLM``'s layout), the model of objectives without NSP."""

    config: BertConfig

    def setup(self):
        self.encoder = BertEncoder(self.config, name="encoder")
        self.mlm = MaskedLMHead(self.config, name="mlm")

    def __call__(
        self,
        input_ids,
        segment_ids,
        input_mask,
        masked_lm_positions,
        *,
        deterministic: bool = True,
        positions=None,
    ) -> jax.Array:
        """<int32>[B, L] x3, <int32>[B, P] -> <float32>[B, P, V] MLM logits (a packed row passes
        its ``sequence_ids`` and ``positions``); the last layer runs at the P positions only."""
        read = self.encoder(
            input_ids, segment_ids, input_mask, deterministic=deterministic,
            output_positions=masked_lm_positions, positions=positions,
        ).sequence_output  # fmt: skip
        return self.mlm(read, None, self.encoder.attend)


# ---- Fine-tuning task heads (paper §4). Same ``encoder``/``pooler`` names as BertModel. ----


class ClassificationOutput(nn.Module):
    """Dropout + dense: <dtype>[..., H] -> <float32>[..., features] (original run_classifier.py;
    'modernbert': HF's ``drop`` and ``classifier``, at ``classifier_dropout_rate``, its kernel
    initialised with std H^-1/2)."""

    config: BertConfig
    features: int

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.config
        rate = cfg.classifier_dropout_rate if cfg.is_modern else cfg.hidden_dropout_rate
        scale = cfg.hidden_size**-0.5 / cfg.initializer_range if cfg.is_modern else 1.0
        x = Dropout(rate)(x, deterministic=deterministic)
        dense = Dense((self.features,), (sh.EMBED, None), cfg, init_scale=scale, name="dense")
        return dense(x).astype(jnp.float32)


class PredictionHead(nn.Module):
    """'modernbert''s task ``head`` before the classifier (HF's ``ModernBertPredictionHead``):
    dense -> head activation -> norm, <dtype>[..., H] -> <dtype>[..., H]."""

    config: BertConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return prediction_transform(self.config, x, self.config.head_act)


def pool(cfg: BertConfig, sequence_output: jax.Array, input_mask: jax.Array) -> jax.Array:
    """'modernbert''s sentence pooling (``classifier_pooling``) of unpacked rows: <dtype>[B, L, H]
    -> <dtype>[B, H], the first real token's state ('cls'; HF's ``argmax`` of the mask) or the
    mean over the real tokens ('mean')."""
    mask = input_mask.astype(sequence_output.dtype)
    if cfg.classifier_pooling == "mean":
        total = jnp.einsum("bl,blh->bh", mask, sequence_output)
        return total / jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1)
    first = jnp.argmax(input_mask, axis=1)
    return jnp.take_along_axis(sequence_output, first[:, None, None], axis=1)[:, 0]


def pool_packed(sequence_output: jax.Array, sequence_ids: jax.Array, k: int) -> jax.Array:
    """'mean' pooling of a packed row's K instances: <dtype>[B, L, H], <int32>[B, L] (1..K per
    instance, 0 padding) -> <dtype>[B, K, H] (an empty slot: zeros)."""
    slots = (sequence_ids[:, None, :] == jnp.arange(1, k + 1)[None, :, None]).astype(
        sequence_output.dtype
    )  # [B, K, L]
    total = jnp.einsum("bkl,blh->bkh", slots, sequence_output)
    return total / jnp.maximum(jnp.sum(slots, axis=2, keepdims=True), 1)


class BertForSequenceClassification(nn.Module):
    """[CLS] classifier on the pooled output -> <float32>[B, num_labels] (1 label: regression);
    with ``rnn``, on the BiLSTM's final states (module docstring)."""

    config: BertConfig
    num_labels: int
    rnn: BiLSTMConfig | None = None

    def setup(self):
        _check_modern_rnn(self.config, self.rnn)
        self.encoder = BertEncoder(self.config, name="encoder")
        if self.config.is_modern:
            self.head = PredictionHead(self.config, name="head")
        else:
            self.pooler = Pooler(self.config, name="pooler")
        if self.rnn is not None:
            self.bilstm = BiLSTM(self.config, self.rnn, name="bilstm")
        self.classifier = ClassificationOutput(self.config, self.num_labels, name="classifier")

    def __call__(
        self,
        input_ids,
        segment_ids,
        input_mask,
        *,
        deterministic: bool = True,
        positions=None,
        cls_positions=None,
    ):
        """<int32>[B, L] x3 -> <float32>[B, num_labels].

        Packed rows (``bertjax.finetune.packed``) pass their ``sequence_ids`` as ``input_mask``,
        their ``positions`` and ``cls_positions`` <int32>[B, K], the examples' [CLS] positions:
        the last layer runs there only and the output is <float32>[B, K, num_labels] (with
        ``rnn`` every position runs: the BiLSTM reads each example whole; 'modernbert' with
        'mean' pooling too: each example's mean over its tokens)."""
        if self.config.is_modern:
            return self._modern(input_ids, segment_ids, input_mask, deterministic, positions,
                                cls_positions)  # fmt: skip
        if self.rnn is not None:
            sequence_output = self.encoder(
                input_ids, segment_ids, input_mask, deterministic=deterministic,
                positions=positions,
            ).sequence_output  # fmt: skip
            k = 0 if cls_positions is None else cls_positions.shape[1]
            return self.classifier(self.bilstm(sequence_output, input_mask, k)[1], deterministic)
        if cls_positions is None:
            sequence_output = self.encoder(
                input_ids, segment_ids, input_mask, deterministic=deterministic
            ).sequence_output
            return self.classifier(self.pooler(sequence_output), deterministic)
        read = self.encoder(
            input_ids, segment_ids, input_mask, deterministic=deterministic,
            output_positions=cls_positions, positions=positions,
        ).sequence_output  # fmt: skip
        return self.classifier(self.pooler(read, each=True), deterministic)

    def _modern(self, input_ids, segment_ids, input_mask, deterministic, positions, cls_positions):
        """HF's ``ModernBertForSequenceClassification``: pool, head, dropout, classifier."""
        cfg = self.config
        at_cls = cls_positions is not None and cfg.classifier_pooling == "cls"
        read = self.encoder(
            input_ids, segment_ids, input_mask, deterministic=deterministic, positions=positions,
            output_positions=cls_positions if at_cls else None,
        ).sequence_output  # fmt: skip
        if at_cls:
            pooled = read  # [B, K, H]: the examples' [CLS] states
        elif cls_positions is not None:
            pooled = pool_packed(read, input_mask, cls_positions.shape[1])
        else:
            pooled = pool(cfg, read, input_mask)
        return self.classifier(self.head(pooled), deterministic)


def _check_modern_rnn(cfg: BertConfig, rnn: BiLSTMConfig | None) -> None:
    if cfg.is_modern and rnn is not None:
        raise ValueError(
            "a BiLSTM head (the paper's Table 5) is BERT's; architecture 'modernbert' has HF's "
            "prediction heads"
        )


class BertForQuestionAnswering(nn.Module):
    """Start / end vectors S, E on the sequence output -> <float32>[B, L, 2] (start, end) logits."""

    config: BertConfig
    rnn: BiLSTMConfig | None = None  # S, E score the BiLSTM's outputs

    def setup(self):
        _check_modern_rnn(self.config, self.rnn)
        self.encoder = BertEncoder(self.config, name="encoder")
        if self.rnn is not None:
            self.bilstm = BiLSTM(self.config, self.rnn, name="bilstm")
        if self.config.is_modern:  # HF's ModernBertForQuestionAnswering: head, drop, classifier
            self.head = PredictionHead(self.config, name="head")
            self.classifier = ClassificationOutput(self.config, 2, name="classifier")
        else:
            self.span = Dense((2,), (sh.EMBED, None), self.config, name="span")

    def __call__(self, input_ids, segment_ids, input_mask, *, deterministic: bool = True):
        sequence_output = self.encoder(
            input_ids, segment_ids, input_mask, deterministic=deterministic
        ).sequence_output
        if self.config.is_modern:
            return self.classifier(self.head(sequence_output), deterministic)
        if self.rnn is not None:
            sequence_output = self.bilstm(sequence_output, input_mask)[0]
        return self.span(sequence_output).astype(jnp.float32)


class BertForTokenClassification(nn.Module):
    """Per-token tagger on the sequence output (with ``rnn``, on the BiLSTM's outputs) ->
    <float32>[B, L, num_labels]."""

    config: BertConfig
    num_labels: int
    rnn: BiLSTMConfig | None = None

    def setup(self):
        _check_modern_rnn(self.config, self.rnn)
        self.encoder = BertEncoder(self.config, name="encoder")
        if self.config.is_modern:  # HF's ModernBertForTokenClassification: head, drop, classifier
            self.head = PredictionHead(self.config, name="head")
        if self.rnn is not None:
            self.bilstm = BiLSTM(self.config, self.rnn, name="bilstm")
        self.classifier = ClassificationOutput(self.config, self.num_labels, name="classifier")

    def __call__(
        self, input_ids, segment_ids, input_mask, *, deterministic: bool = True, positions=None,
        cls_positions=None,
    ):  # fmt: skip
        """<int32>[B, L] x3 -> <float32>[B, L, num_labels]; packed rows pass their
        ``sequence_ids`` as ``input_mask`` and their ``positions`` (with ``rnn`` also their
        ``cls_positions`` <int32>[B, K]: K, the instances the BiLSTM reads alone)."""
        sequence_output = self.encoder(
            input_ids, segment_ids, input_mask, deterministic=deterministic, positions=positions
        ).sequence_output
        if self.rnn is not None:
            if positions is not None and cls_positions is None:
                raise ValueError("a packed row's BiLSTM needs its cls_positions (K instances)")
            k = 0 if cls_positions is None else cls_positions.shape[1]
            sequence_output = self.bilstm(sequence_output, input_mask, k)[0]
        if self.config.is_modern:
            sequence_output = self.head(sequence_output)
        return self.classifier(sequence_output, deterministic)


class BertForMultipleChoice(nn.Module):
    """A vector V scores each choice's pooled output (with ``rnn``, its BiLSTM final states) ->
    <float32>[B, C] (softmax over choices)."""

    config: BertConfig
    rnn: BiLSTMConfig | None = None

    def setup(self):
        _check_modern_rnn(self.config, self.rnn)
        self.encoder = BertEncoder(self.config, name="encoder")
        if self.config.is_modern:  # HF's ModernBertForMultipleChoice: pool, head, classifier
            self.head = PredictionHead(self.config, name="head")
        else:
            self.pooler = Pooler(self.config, name="pooler")
        if self.rnn is not None:
            self.bilstm = BiLSTM(self.config, self.rnn, name="bilstm")
        self.classifier = ClassificationOutput(self.config, 1, name="classifier")

    def __call__(self, input_ids, segment_ids, input_mask, *, deterministic: bool = True):
        """<int32>[B, C, L] x3 -> <float32>[B, C]."""
        batch, choices, length = input_ids.shape
        flat = lambda x: x.reshape(batch * choices, length)
        sequence_output = self.encoder(
            flat(input_ids), flat(segment_ids), flat(input_mask), deterministic=deterministic
        ).sequence_output
        if self.config.is_modern:
            summary = self.head(pool(self.config, sequence_output, flat(input_mask)))
        elif self.rnn is not None:
            summary = self.bilstm(sequence_output, flat(input_mask))[1]
        else:
            summary = self.pooler(sequence_output)
        return self.classifier(summary, deterministic).reshape(batch, choices)
