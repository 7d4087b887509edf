"""What the pretraining loop feeds the step, and the checks that run before compiling.

``host_batches`` yields this process's numpy rows of the batch spec (``bertjax.data.pipeline``'s
docstring; ``bertjax.pretrain.objective.BATCH_KEYS``): from ``config.data`` through the input
pipeline, or random rows of the right shapes when ``config.train.synthetic_data`` is set.
``data_signature`` names the stream so a resumed run continues its position only on the same
data.

``check_config`` / ``check_data`` raise ValueError naming the config field before anything is
compiled; ``check_batch`` checks the first batch, since TFRecords may disagree with the config.
"""

from __future__ import annotations

import itertools
import json

import jax
import numpy as np
from etils import epath
from jax.sharding import Mesh

from bertjax.model.config import BertConfig
from bertjax.pretrain.objective import BATCH_KEYS
from bertjax.training import batch_schedule, checkpoint
from bertjax.training import sharding as sh
from bertjax.training.batch_schedule import BatchSchedule

# ---------------------------------------------------------------- checks before compiling

BATCH_UNITS = ("instances", "rows")  # config.train.batch_unit (configs/base.py)


def resolve_packed_batch(
    config, mesh: Mesh, process_count: int, announce: bool = True, per_row: float | None = None
):
    """With ``data.pack_sequences`` the batch sizes count **instances**, the paper's batch
    (256 sequences): ``config`` with ``train.global_batch_size`` and ``train.eval_batch_size``
    in rows at the data's mean instances per row (``bertjax.data.pipeline.instances_per_row``:
    exact for the online pipeline, counted for packed TFRecords), through the one resolver
    (``bertjax.training.sharding.packed_batch_sizes``). What ``bertjax.main`` runs and
    ``bertjax.compile`` compiles. The learning-rate schedule counts steps, so it is unchanged in
    instances too. Returns ``config`` (unpacked) or a resolved copy; ``announce``: print the
    rows (``bertjax.compile --json`` prints only its report); ``per_row``: the instances per row
    when the caller has counted them already. With ``train.batch_unit='rows'`` the sizes already
    count rows and stay as given, rounded to the batch's multiple."""
    unit = str(config.train.batch_unit)
    if unit not in BATCH_UNITS:
        raise ValueError(
            f"config.train.batch_unit={unit!r}: expected one of {', '.join(BATCH_UNITS)}"
        )
    if not config.data.pack_sequences:
        return config
    if config.train.synthetic_data:
        raise ValueError("config.data.pack_sequences needs real data, not train.synthetic_data")
    from bertjax.data import pipeline  # noqa: PLC0415

    pipeline.check_data_config(config.data)
    if unit == "rows":  # the sizes are rows already (ModernBERT's): only the rounding applies
        return sh.packed_batch_sizes(config, mesh, process_count, 1.0, "rows", announce)
    if per_row is None:
        per_row = pipeline.instances_per_row(config.data, int(config.seed))
    return sh.packed_batch_sizes(config, mesh, process_count, per_row, announce=announce)


def check_config(config, bert_config: BertConfig, mesh: Mesh, process_count: int) -> None:
    """Raises ValueError naming the config field when the run cannot work (before compiling)."""
    batch = int(config.train.global_batch_size)
    accum = int(config.train.grad_accum_steps)
    shards = sh.num_batch_shards(mesh)
    if batch <= 0 or accum <= 0:
        raise ValueError(
            f"config.train.global_batch_size={batch} and grad_accum_steps={accum} must be positive"
        )
    if batch % accum:
        raise ValueError(
            f"config.train.global_batch_size={batch} is not divisible by "
            f"config.train.grad_accum_steps={accum}"
        )
    if (batch // accum) % shards:
        raise ValueError(
            f"global batch {batch} / {accum} micro-batches = {batch // accum} is not "
            f"divisible by {shards} data shards (config.mesh.shape={mesh.shape})"
        )
    if batch % process_count:
        raise ValueError(
            f"config.train.global_batch_size={batch} is not divisible by {process_count} processes"
        )
    batch_schedule.on_mesh(config, mesh, process_count)  # the warm-up's fields
    length = int(config.data.max_seq_length)
    if length > bert_config.max_position_embeddings:
        raise ValueError(
            f"config.data.max_seq_length={length} exceeds "
            f"config.model.max_position_embeddings="
            f"{bert_config.max_position_embeddings}"
        )
    if int(config.data.max_predictions_per_seq) > length:
        raise ValueError(
            f"config.data.max_predictions_per_seq="
            f"{config.data.max_predictions_per_seq} exceeds "
            f"config.data.max_seq_length={length}"
        )
    if int(config.train.eval_every) and int(config.train.eval_batch_size) % max(
        shards, process_count
    ):
        raise ValueError(
            f"config.train.eval_batch_size={config.train.eval_batch_size} is not "
            f"divisible by {max(shards, process_count)} data shards / processes"
        )


def check_data(config, bert_config: BertConfig) -> None:
    """The data config itself (the pipeline's checks) and the vocab against the model."""
    if config.train.synthetic_data:
        return
    from bertjax.data import pipeline  # noqa: PLC0415

    pipeline.check_data_config(config.data, config.model)
    path = epath.Path(config.data.vocab_file)
    if not path.exists():
        raise ValueError(f"config.data.vocab_file={path}: file not found")
    entries = checkpoint.vocab_fingerprint(path)["entries"]  # lines, pieces or BPE ids
    if entries != bert_config.vocab_size:
        raise ValueError(
            f"config.model.vocab_size={bert_config.vocab_size} but "
            f"config.data.vocab_file={path} has {entries} entries"
        )


def check_batch(host_batch: dict, config, per_host_batch: int) -> None:
    """Checks the first batch against the config (TFRecords may disagree with it)."""
    expect = {
        "input_ids": (per_host_batch, int(config.data.max_seq_length)),
        "masked_lm_positions": (per_host_batch, int(config.data.max_predictions_per_seq)),
    }
    missing = [k for k in BATCH_KEYS if k not in host_batch]
    if missing:
        raise ValueError(f"input batches lack features {missing}; expected {list(BATCH_KEYS)}")
    for key, shape in expect.items():
        got = tuple(np.shape(host_batch[key]))
        if got != shape:
            raise ValueError(
                f"input batch {key} has shape {got} but the config implies {shape} "
                "(config.data.max_seq_length, max_predictions_per_seq, "
                "per-host batch)"
            )


# ---------------------------------------------------------------- data


def synthetic_batches(
    vocab_size: int,
    batch_size: int,
    length: int,
    predictions: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
    start_batch: int = 0,
):
    """Random batches of the pretraining batch spec, a pure function of (seed, position).

    Global batch ``k`` is drawn whole and host ``h`` keeps its rows ``h*B .. (h+1)*B - 1``, so
    the global batch does not depend on the process count. For benchmarks and smoke tests
    (``config.train.synthetic_data``); there is nothing to learn in it.
    """
    index, rows = start_batch, batch_size * process_count
    mine = slice(process_index * batch_size, (process_index + 1) * batch_size)
    while True:
        rng = np.random.default_rng([seed, index])
        input_ids = rng.integers(5, vocab_size, (rows, length), dtype=np.int32)[mine]
        order = np.argsort(rng.random((rows, length - 1)), axis=1)[mine]
        positions = np.sort(order[:, :predictions] + 1, axis=1).astype(np.int32)
        labels = rng.integers(0, 2, (rows,), dtype=np.int32)[mine]
        segments = (np.arange(length)[None] >= length // 2).astype(np.int32)
        yield {
            "input_ids": input_ids,
            "segment_ids": segments.repeat(batch_size, 0),
            "input_mask": np.ones((batch_size, length), np.int32),
            "masked_lm_positions": positions,
            "masked_lm_ids": np.take_along_axis(input_ids, positions, axis=1),
            "masked_lm_weights": np.ones((batch_size, predictions), np.float32),
            "next_sentence_labels": labels,
        }
        index += 1


def data_signature(config, vocab=None, schedule: BatchSchedule | None = None) -> str:
    """Names the data stream; a resumed run continues its position only on the same stream. The
    vocab is named by its fingerprint (``checkpoint.vocab_fingerprint``), not its path: a resumed
    continued run tokenizes with its workdir's copy of the vocab its first start read from the
    init checkpoint. ``vocab``: what names it instead (see :func:`same_stream`). ``schedule``:
    a batch-size warm-up's sizes and stages name it too (none: the stream is named as before
    warm-ups existed)."""
    data = config.data.to_dict()
    if vocab is not None:
        data["vocab_file"] = vocab
    elif data["vocab_file"] and not config.train.synthetic_data:
        data["vocab_file"] = checkpoint.vocab_fingerprint(data["vocab_file"])
    named = {
        "data": data,
        "seed": config.seed,
        "synthetic": config.train.synthetic_data,
        "batch": config.train.global_batch_size,
    }
    if schedule is not None and schedule.sizes:
        named["batch_warmup"] = schedule.signature()
    return json.dumps(named, sort_keys=True, default=str)


def same_stream(saved: str, signature: str, config, schedule: BatchSchedule | None = None) -> bool:
    """Whether a checkpoint's ``saved`` signature names the stream of ``config`` (whose
    :func:`data_signature` is ``signature``). Signatures saved before the vocab was named by its
    fingerprint name it by its path, and still match the same path."""
    return saved == signature or saved == data_signature(config, config.data.vocab_file, schedule)


def host_batches(config, bert_config, *, split: str, batch_size: int, start_batch: int = 0):
    """Iterator of this process's numpy batches (``batch_size`` rows each)."""
    length, predictions = int(config.data.max_seq_length), int(config.data.max_predictions_per_seq)
    if config.train.synthetic_data:
        seed = config.seed + (0 if split == "train" else 1)
        gen = synthetic_batches(
            bert_config.vocab_size,
            batch_size,
            length,
            predictions,
            seed,
            jax.process_index(),
            jax.process_count(),
            start_batch,
        )
        return gen if split == "train" else itertools.islice(gen, config.train.eval_steps)
    from bertjax.data import pipeline  # noqa: PLC0415 - TF is only needed for real data

    dataset = pipeline.create_pretrain_dataset(
        config.data,
        batch_size=batch_size,
        seed=config.seed,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        split=split,
        start_batch=start_batch,
    )
    return pipeline.numpy_batches(dataset, config.data, split)
