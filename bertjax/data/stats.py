"""What a user needs to trust a pretraining dataset, for TFRecords or the online pipeline.

The command is ``python -m bertjax.data_stats``. Counts examples (instances), rows and instances
per row (1 unless the rows are packed: ``bertjax.data.packing``), tokens, padding fraction (the
padding share, 1 - real tokens / token slots of the rows; beside it, after packing, the share the
fewest possible rows would leave), the rows against the lower bound ``ceil(real tokens / L)``
(no packing of those tokens needs fewer: ``lower bound / rows`` is the packing's efficiency
against it; for the online pipeline also over its whole split, as it packs it), mask
rate (predictions / real tokens, [CLS]/[SEP] included as in the original's ``num_to_predict``) and
its [MASK]/kept/random split, NSP balance, truncation rate (known for the online pipeline and at
generation time; TFRecords do not record it), [UNK] rate and a histogram of row lengths (real
tokens per row). A position counts as "kept" when its input id equals the label, so a random
replacement that happens to draw the original id counts as kept.
"""

from __future__ import annotations

import numpy as np

from bertjax.data import packing
from bertjax.data.instances import DataError

_NUM_BINS = 8


class Accumulator:
    """Sums statistics over batches in the batch format of ``bertjax.data.pipeline`` (numpy)."""

    def __init__(self, max_seq_length: int, tokenizer):
        self.length = max_seq_length
        self.mask_id, self.unk_id = tokenizer.mask_id, tokenizer.unk_id
        self.counts = dict(
            examples=0,
            rows=0,
            ideal_rows=0,  # the fewest rows a packing could use (bertjax.data.packing); 0: unknown
            tokens=0,
            predictions=0,
            masked=0,
            kept=0,
            randomised=0,
            not_next=0,
            unk=0,
            truncated=0,
            truncation_known=True,
        )
        self.histogram = np.zeros(_NUM_BINS, dtype=np.int64)

    def add(self, batch: dict, original_ids=None, truncated=None) -> None:
        """``batch``: the batch contract's features (``bertjax.data.pipeline``), packed rows
        (with ``sequence_ids``) or not; ``original_ids <int32>[B, L]``: the ids before masking;
        ``truncated <int>[B]``: truncated instances per row."""
        rows = np.asarray(batch.get("example_weight", np.ones(len(batch["input_ids"])))) > 0
        ids = np.asarray(batch["input_ids"])[rows]
        input_mask = np.asarray(batch["input_mask"])[rows]
        positions = np.asarray(batch["masked_lm_positions"])[rows]
        labels = np.asarray(batch["masked_lm_ids"])[rows]
        weights = np.asarray(batch["masked_lm_weights"])[rows] > 0
        if original_ids is None:  # put the labels back at their positions
            original_ids = ids.copy()
            r, c = np.nonzero(weights)
            original_ids[r, positions[r, c]] = labels[r, c]
        else:
            original_ids = np.asarray(original_ids)[rows]
        at_positions = np.take_along_axis(ids, positions, axis=1)
        c = self.counts
        labels_nsp = np.asarray(batch["next_sentence_labels"])[rows]
        if "sequence_ids" in batch:  # packed: count instances by their slots
            real_instances = np.asarray(batch["instance_weights"])[rows] > 0
        else:
            real_instances = np.ones(labels_nsp.shape, dtype=bool)
        c["examples"] += int(real_instances.sum())
        c["rows"] += int(rows.sum())
        c["tokens"] += int(input_mask.sum())
        c["predictions"] += int(weights.sum())
        c["masked"] += int((weights & (at_positions == self.mask_id)).sum())
        c["kept"] += int((weights & (at_positions == labels)).sum())
        c["randomised"] += int(
            (weights & (at_positions != labels) & (at_positions != self.mask_id)).sum()
        )
        c["not_next"] += int((labels_nsp * real_instances).sum())
        c["unk"] += int(((original_ids == self.unk_id) & (input_mask > 0)).sum())
        if truncated is None:
            c["truncation_known"] = False
        else:
            c["truncated"] += int(np.asarray(truncated)[rows].sum())
        lengths = input_mask.sum(axis=1)
        bins = np.clip((lengths * _NUM_BINS - 1) // self.length, 0, _NUM_BINS - 1)  # (lo, hi]
        self.histogram += np.bincount(bins, minlength=_NUM_BINS)

    def merge(self, other: Accumulator) -> Accumulator:
        """Adds ``other``'s counts (e.g. from another worker process) to this one; returns it."""
        for name, value in other.counts.items():
            if name == "truncation_known":
                self.counts[name] = self.counts[name] and value
            else:
                self.counts[name] += value
        self.histogram += other.histogram
        return self

    def summary(self) -> dict:
        c = dict(self.counts)
        examples, tokens, predictions, rows = (
            max(c["examples"], 1),
            max(c["tokens"], 1),
            max(c["predictions"], 1),
            max(c["rows"], 1),
        )
        ideal = c["ideal_rows"]
        bound = packing.lower_bound_rows(c["tokens"], self.length)
        return dict(
            examples=c["examples"],
            rows=c["rows"],
            instances_per_row=c["examples"] / rows,
            tokens=c["tokens"],
            padding_fraction=1.0 - c["tokens"] / (rows * self.length),
            ideal_padding_fraction=1.0 - c["tokens"] / (ideal * self.length) if ideal else None,
            lower_bound_rows=bound,
            bound_efficiency=bound / rows,
            mask_rate=c["predictions"] / tokens,
            mask_split=(
                c["masked"] / predictions,
                c["kept"] / predictions,
                c["randomised"] / predictions,
            ),
            not_next_fraction=c["not_next"] / examples,
            truncation_rate=c["truncated"] / examples if c["truncation_known"] else None,
            unk_rate=c["unk"] / tokens,
            length_histogram=[
                (
                    int(i * self.length / _NUM_BINS) + 1,
                    int((i + 1) * self.length / _NUM_BINS),
                    int(n),
                )
                for i, n in enumerate(self.histogram)
            ],
        )


def format_summary(s: dict) -> str:
    ideal = s["ideal_padding_fraction"]
    ideal = "" if ideal is None else f"; packing's ideal {100 * ideal:.2f}%"
    truncation = (
        "unknown (not stored in TFRecords)"
        if s["truncation_rate"] is None
        else (f"{100 * s['truncation_rate']:.1f}%")
    )
    lines = [
        f"examples            {s['examples']}",
        f"rows                {s['rows']}  ({s['instances_per_row']:.2f} instances per row)",
        f"tokens              {s['tokens']}  (padding {100 * s['padding_fraction']:.1f}%{ideal})",
        f"rows vs bound       {100 * s['bound_efficiency']:.1f}% efficient: ceil(tokens / L) = "
        f"{s['lower_bound_rows']} rows",
        *_split_lines(s.get("split")),
        f"mask rate           {100 * s['mask_rate']:.2f}% of real tokens",
        "mask split          [MASK] {:.1f}% / kept {:.1f}% / random {:.1f}%".format(
            *(100 * x for x in s["mask_split"])
        ),
        f"NSP                 NotNext {100 * s['not_next_fraction']:.1f}% / IsNext "
        f"{100 - 100 * s['not_next_fraction']:.1f}%",
        f"truncated           {truncation}",
        f"[UNK] rate          {100 * s['unk_rate']:.3f}% of real tokens",
        "length histogram",
    ]
    total = max(sum(n for _, _, n in s["length_histogram"]), 1)
    for low, high, n in s["length_histogram"]:
        lines.append(f"  {low:4d}-{high:<4d} {n:8d} {'#' * round(40 * n / total)}")
    return "\n".join(lines)


def _split_lines(split: dict | None) -> list[str]:
    """The online pipeline's whole split (``split_rows``), when known."""
    if split is None:
        return []
    return [
        f"whole split         {split['rows']} rows of {split['instances']} instances, padding "
        f"{100 * split['padding_fraction']:.2f}%; {100 * split['bound_efficiency']:.2f}% "
        f"efficient: ceil(tokens / L) = {split['lower_bound_rows']} rows"
    ]


def split_rows(table, data_config, spec, seed: int) -> dict:
    """The rows of a whole split as the online pipeline makes them from its instance ``table``:
    one per instance, or packed (``pipeline.pack_table``) -> rows, instances, tokens, padding
    fraction, the lower bound ``ceil(tokens / L)`` and the rows' efficiency against it."""
    from bertjax.data import pipeline

    length, tokens = int(data_config.max_seq_length), int(table.num_tokens().sum())
    rows = table.num_rows
    if data_config.pack_sequences:
        rows = len(pipeline.pack_table(table, data_config, spec, seed))
    bound = packing.lower_bound_rows(tokens, length)
    return dict(
        rows=rows,
        instances=table.num_rows,
        tokens=tokens,
        padding_fraction=1.0 - tokens / max(rows * length, 1),
        lower_bound_rows=bound,
        bound_efficiency=bound / max(rows, 1),
    )


def tfrecord_stats(files: list[str], data_config, tokenizer) -> dict:
    """Statistics of every record in ``files`` (parsed with the original spec)."""
    import tensorflow as tf

    from bertjax.data import tfrecords

    parse = tfrecords.parser(data_config, tfrecords.pack_size_of(files))
    accumulator = Accumulator(data_config.max_seq_length, tokenizer)
    dataset = tf.data.TFRecordDataset(files).batch(1024).map(parse)
    try:
        for batch in dataset.as_numpy_iterator():
            accumulator.add(batch)
    except tf.errors.OpError as e:  # a corrupt or truncated file, or a record of another shape
        raise DataError(f"{files}: cannot parse ({e.message.splitlines()[0]})") from None
    return accumulator.summary()


def pipeline_stats(config, split: str, num_batches: int) -> dict:
    """Statistics of the first ``num_batches`` batches of the online pipeline."""
    from bertjax.data import pipeline, sources

    data = config.data
    tokenizer = sources.create_tokenizer(data)
    dataset = pipeline.create_pretrain_dataset(
        data, batch_size=64, seed=config.seed, process_index=0, process_count=1, split=split
    )
    accumulator = Accumulator(data.max_seq_length, tokenizer)
    for batch in pipeline.numpy_batches(dataset.take(num_batches), data, split):
        accumulator.add(batch)
    summary = accumulator.summary()
    if data.source != "tfrecord":
        table = sources.open_or_build(data, tokenizer, split, config.seed)
        summary["truncation_rate"] = table.meta["truncated"] / max(table.meta["instances"], 1)
        spec = pipeline.masking_spec(data, tokenizer)
        summary["split"] = split_rows(table, data, spec, int(config.seed))
    return summary
