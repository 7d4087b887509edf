"""Packed fine-tuning features: whole examples side by side in rows, no compute on padding.

With ``config.data.pack_sequences`` the sentence(-pair) tasks, GLUE classification and regression
and CoNLL NER tagging, put up to ``K = config.data.max_sequences_per_pack`` features in one row of
``L = config.data.max_seq_length`` tokens: best-fit decreasing (``bertjax.data.packing.pack``) over
the whole split, once. Each feature keeps its own [CLS], its own positions from 0, and attends
only to itself: the packed row of pretraining (``bertjax.data.pipeline``'s "The packed row",
without cross-contamination), built by the same builder with the same names
(``bertjax.data.packing.pack_features``), so the model gives every feature what it gives the feature
alone. SQuAD and SWAG stay unpacked: their windows (384 tokens with a doc stride) and their
four-choice rows are mostly full already.

**Layout** of ``Packed.features.arrays`` for R rows::

    input_ids, segment_ids  <int32>[R, L]   the features' real tokens, one after another, then 0
    input_mask              <int32>[R, L]   1 on real tokens (the step's token count)
    positions               <int32>[R, L]   0, 1, ... within each feature
    sequence_ids            <int32>[R, L]   1..k per feature, 0 on padding: the attention mask
    cls_positions           <int32>[R, K]   each feature's [CLS] (its first token); 0 when empty
    instance_weights        <float32>[R, K] 1 per feature, 0 on an empty slot
    label_ids               classification <int32>[R, K], regression <float32>[R, K],
                            tagging <int32>[R, L] (at the tokens' row positions)
    label_weights           tagging only: <float32>[R, L]

``Packed.rows`` lists each row's features (indices into the unpacked split, increasing), and
``unpack`` turns the model's outputs on the rows back into the unpacked layout
(``[N, num_labels]``, or ``[N, L, num_labels]`` with zeros on padding), which the tasks' metrics
and prediction writers read unchanged.

**Batches count examples.** ``config.train.global_batch_size`` and
``config.train.eval_batch_size`` stay examples (the paper's 32): the one resolver of packed
batch sizes, pretraining's too (``bertjax.training.sharding.packed_batch_sizes``), turns them into
the rows that hold that many on average, rounded to a multiple of the data shards x
micro-batches and of the processes. Each epoch shuffles the rows (they are packed once), so the
steps per epoch are ``rows / rows per step``, the same number of examples as unpacked; the loss
is the mean over the step's examples, as unpacked.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bertjax.data import packing
from bertjax.finetune.tasks import Features, FinetuneInputError

PACKABLE_HEADS = ("classification", "regression", "tagging")
PACKED_INPUTS = ("positions", "sequence_ids", "cls_positions")  # beside input_ids, segment_ids


@dataclasses.dataclass
class Packed:
    features: Features  # the rows (the module docstring's layout)
    rows: list[list[int]]  # per row, the unpacked features it holds, in order
    num_features: int  # N, the unpacked split's size

    @property
    def examples_per_row(self) -> float:
        return self.num_features / max(len(self.rows), 1)


def check(config, head: str) -> None:
    """FinetuneInputError naming the field when packing is asked of a head that stays unpacked
    or with a K below 1."""
    if not config.data.pack_sequences:
        return
    if head not in PACKABLE_HEADS:
        raise FinetuneInputError(
            f"config.data.pack_sequences: the {head} head ({config.task.name}) stays unpacked "
            "(SQuAD's windows and SWAG's choices fill their rows); packing is for "
            f"{', '.join(PACKABLE_HEADS)} tasks"
        )
    if int(config.data.max_sequences_per_pack) < 1:
        raise FinetuneInputError(
            f"config.data.max_sequences_per_pack={config.data.max_sequences_per_pack}: "
            "expected >= 1"
        )


def pack(features: Features, head: str, max_sequences_per_pack: int) -> Packed:
    """The split's features (``bertjax.finetune.tasks``' layout, ``[N, L]``) in packed rows
    (``bertjax.data.packing.pack_features``, the packed row's builder and names)."""
    arrays = features.arrays
    input_mask = np.asarray(arrays["input_mask"])
    n, length = input_mask.shape
    lengths = input_mask.sum(axis=1).astype(np.int64)
    rows = packing.pack(lengths, np.zeros(n, np.int64), length, max_sequences_per_pack, 1)
    names = ("input_ids", "segment_ids", "input_mask", "label_ids")
    names += ("label_weights",) if head == "tagging" else ()  # labels per token: [N, L]
    unpacked = {name: arrays[name] for name in names}
    out = packing.pack_features(unpacked, rows, max_sequences_per_pack)
    return Packed(Features(out, skipped=features.skipped), rows, n)


def unpack(head: str, outputs: np.ndarray, packed: Packed, length: int) -> np.ndarray:
    """The model's outputs on the rows (``[R, K, C]``, or ``[R, L, C]`` for tagging) -> the
    unpacked layout, feature by feature: ``[N, C]``, or ``[N, L, C]`` with zeros on padding."""
    outputs = np.asarray(outputs)
    if head != "tagging":
        result = np.zeros((packed.num_features, *outputs.shape[2:]), outputs.dtype)
        for row_index, row in enumerate(packed.rows):
            result[row] = outputs[row_index, : len(row)]
        return result
    result = np.zeros((packed.num_features, length, *outputs.shape[2:]), outputs.dtype)
    sequence_ids = packed.features.arrays["sequence_ids"]
    for row_index, row in enumerate(packed.rows):
        for slot, i in enumerate(row):
            tokens = sequence_ids[row_index] == slot + 1
            result[i, : int(tokens.sum())] = outputs[row_index, tokens]
    return result
