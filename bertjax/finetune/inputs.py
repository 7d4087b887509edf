"""What the fine-tuning loop feeds the step: the checkpoint, the task's features, the batches.

``prepare`` reads the pretrained checkpoint (any format ``bertjax.interop`` reads) and builds the
task and its tokenizer; on a resume (the workdir holds the run's record, format 3:
``bertjax.training.init_record``) the model, vocab and casing come from the record instead, and
the checkpoint is read (:class:`Pretrained`) only when no step restores, from
``config.init_checkpoint`` or else the recorded source, and only if it holds the recorded params
(the record wins over a ``config.init_checkpoint`` or ``config.data.do_lower_case`` that differs).
``Data`` reads and featurizes each split once; ``init_params`` adds fresh heads to the
pretrained subtrees; ``train_batches`` deals shuffled full batches, epoch by epoch (of features,
or of packed rows: ``bertjax.finetune.packed``).
The feature arrays' layout is ``bertjax.finetune.tasks``' docstring.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import jax
import numpy as np
from etils import epath
from flax import linen as nn

from bertjax.data.pipeline import HOST_SECONDS
from bertjax.finetune import tasks
from bertjax.finetune.objective import model_input_specs
from bertjax.finetune.tasks import FinetuneInputError
from bertjax.interop import formats
from bertjax.model.config import BertConfig
from bertjax.model.encoder import stack_layers
from bertjax.training import checkpoint, init_record
from bertjax.training import workdir as workdir_lib

_MODEL_OVERRIDES = (
    "hidden_dropout_rate",
    "attention_dropout_rate",
    "dtype",
    "scan_layers",
    "remat_policy",
    "attention_impl",
    "attention_check",
)


def model_overrides(config) -> dict:
    """The ``config.model`` fields a fine-tuning run sets on the checkpoint's BertConfig."""
    return {k: config.model[k] for k in _MODEL_OVERRIDES}


@dataclasses.dataclass
class Pretrained:
    """The params a run starts from: read already, or (a resume from its workdir's record) read
    by :meth:`params` only when asked, which happens only when no step restores."""

    record: init_record.InitRecord | None  # the init checkpoint; None: a fine-tuned checkpoint
    from_record: bool  # a resume: model, vocab and casing came from the workdir's record
    loaded: dict | None = None
    read: Callable[[str], dict] | None = None  # workdir (named in its errors) -> params

    def params(self, workdir: str = "") -> dict:
        """The params; ``workdir``: the run's that asks for them (a sweep's runs share them)."""
        if self.loaded is None:
            self.loaded = self.read(workdir)
        return self.loaded


def load_checkpoint(config, workdir: str | None = None):
    """``config.init_checkpoint`` (bertjax / HF dir / TF1) -> (:class:`Pretrained`, BertConfig,
    vocab, lower); from ``workdir``'s record when it holds this run's (module docstring).

    ``config.model`` overrides dropout/dtype/layout; ``config.model.hidden_size`` (0 = any) must
    match the checkpoint's.
    """
    record = workdir_lib.read_record(workdir) if workdir else None
    init = init_record.resumed(record, config.init_checkpoint, workdir)
    if init is not None:
        return _from_record(config, record, init, workdir)
    if not config.init_checkpoint:
        raise FinetuneInputError("config.init_checkpoint: expected a bertjax, HF or TF1 checkpoint")
    lower = config.data.do_lower_case  # None: the checkpoint's
    fmt = formats.detect_format(config.init_checkpoint)
    conv = formats.load(config.init_checkpoint, fmt, do_lower_case=lower)
    _check_hidden_size(config, conv.config, config.init_checkpoint)
    bert_config = conv.config.replace(**model_overrides(config))
    record = init_record.InitRecord.of(config.init_checkpoint, fmt, conv.params)
    pretrained = Pretrained(record, False, _layout(conv.params, bert_config))
    return pretrained, bert_config, conv.vocab_file, conv.do_lower_case


def _check_hidden_size(config, found: BertConfig, origin: str) -> None:
    if config.model.hidden_size and config.model.hidden_size != found.hidden_size:
        raise FinetuneInputError(
            f"{origin}: checkpoint hidden size {found.hidden_size} != "
            f"config.model.hidden_size={config.model.hidden_size}"
        )


def _layout(params: dict, bert_config: BertConfig) -> dict:
    if bert_config.scan_layers:
        params = {**params, "encoder": stack_layers(params["encoder"], bert_config.num_layers)}
    return params


def _from_record(config, record: dict, init: init_record.InitRecord, workdir: str):
    """:func:`load_checkpoint` on a resume: the model, vocab and casing of ``workdir``'s record;
    the init checkpoint read only by :meth:`Pretrained.params`."""
    recorded = record["bert_config"]
    _check_hidden_size(config, recorded, str(epath.Path(workdir) / checkpoint.CONFIG_FILE))
    bert_config = recorded.replace(**model_overrides(config))
    lower = bool(record["do_lower_case"])

    def read(run_workdir: str) -> dict:
        load = lambda source: formats.load(source, do_lower_case=lower).params  # noqa: E731
        params = init_record.reread(init, config.init_checkpoint, run_workdir or workdir, load)
        return _layout(params, bert_config)

    print(
        f"resuming {workdir}, fine-tuned from {init.source} ({init.format}): the model, vocab "
        f"and casing of its record",
        flush=True,
    )
    vocab_file = str(checkpoint.vocab_in(workdir, record))
    return Pretrained(init, True, read=read), bert_config, vocab_file, lower


def initial_params(model: nn.Module, pretrained: Pretrained, example: dict, rng, workdir: str):
    """(what ``loop.fit`` starts from in ``workdir`` when no step restores, the record's init
    entry): at a first start the params (:func:`init_params`) and the record naming the subtrees
    the model drew itself; on a resume from the record a function that reads them, and the
    record."""
    if pretrained.from_record:
        read = lambda: init_params(model, pretrained.params(workdir), example, rng)  # noqa: E731
        return read, pretrained.record
    params = init_params(model, pretrained.params(), example, rng)
    fresh = tuple(sorted(set(params) - set(pretrained.params())))
    return params, dataclasses.replace(pretrained.record, fresh=fresh)


def init_params(model: nn.Module, pretrained: dict, example: dict, rng) -> dict:
    """The pretrained subtrees, plus fresh ones (the heads) initialised as the encoder does.

    Shapes come from ``jax.eval_shape`` (nothing is compiled); new kernels and embeddings are
    drawn from the truncated normal(0, initializer_range) seeded by ``rng``, biases are 0 and
    LayerNorm scales 1.
    """
    shapes = nn.unbox(jax.eval_shape(model.init, rng, *model_input_specs(example)))["params"]
    stddev = model.config.initializer_range
    params = {}
    for index, (name, subtree) in enumerate(sorted(shapes.items())):
        if name in pretrained:
            got = jax.tree.map(np.shape, pretrained[name])
            if jax.tree.map(lambda x: tuple(x.shape), subtree) != got:
                raise FinetuneInputError(
                    f"init_checkpoint: subtree {name!r} has shapes {got}, the model expects "
                    f"{jax.tree.map(lambda x: tuple(x.shape), subtree)}"
                )
            params[name] = pretrained[name]
            continue
        leaves, treedef = jax.tree.flatten_with_path(subtree)
        keys = jax.random.split(jax.random.fold_in(rng, index), len(leaves))
        values = [
            _fresh(path[-1].key, leaf, key, stddev)
            for (path, leaf), key in zip(leaves, keys, strict=True)
        ]
        params[name] = jax.tree.unflatten(treedef, values)
    return params


def _fresh(leaf_name: str, leaf, key, stddev: float) -> np.ndarray:
    if leaf_name in ("kernel", "embedding"):
        return np.asarray(nn.initializers.truncated_normal(stddev)(key, leaf.shape, leaf.dtype))
    fill = 1.0 if leaf_name == "scale" else 0.0
    return np.full(leaf.shape, fill, leaf.dtype)


def train_batches(
    features: tasks.Features, batch_size: int, num_steps: int, seed: int, start_batch: int = 0
):
    """This process's rows of shuffled full global batches ``start_batch``, ``start_batch + 1``,
    ... ``num_steps - 1``: one fresh permutation per epoch (the last partial batch dropped), a
    pure function of the seed, so a resumed run gets the batches it would have had."""
    rng = np.random.default_rng(seed)
    n = len(features)
    per_epoch = n // batch_size
    if per_epoch == 0:
        raise FinetuneInputError(
            f"train split has {n} features, fewer than one batch of {batch_size}"
        )
    rows = batch_size // jax.process_count()
    mine = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
    step = 0
    while step < num_steps:
        order = rng.permutation(n)
        for i in range(min(per_epoch, num_steps - step)):
            if step >= start_batch:
                began = time.thread_time()
                index = order[i * batch_size : (i + 1) * batch_size][mine]
                batch = {k: v[index] for k, v in features.arrays.items()}
                if "instance_weights" not in batch:  # packed rows carry theirs, [rows, K]
                    batch["example_weights"] = np.ones((rows,), np.float32)
                # The batch contract's host work (bertjax.data.pipeline): tokenizing was done
                # once, before training, so a batch costs only this gather.
                batch[HOST_SECONDS] = np.float32(time.thread_time() - began)
                yield batch
            step += 1


class Data:
    """Examples and features of every split a run needs, tokenized once."""

    def __init__(self, task, config, tokenizer, splits):
        self.examples, self.features = {}, {}
        for split in splits:
            examples = task.read(config.task.data_dir, split)
            if not examples:  # caught here, before a model is built or the workdir written
                raise FinetuneInputError(
                    f"{task.split_path(config.task.data_dir, split)}: no examples in the "
                    f"{split} split (an empty file, or only a header?)"
                )
            self.examples[split] = examples
            self.features[split] = task.featurize(examples, tokenizer, config)
            print(
                f"{task.name}/{split}: {len(examples)} examples -> "
                f"{len(self.features[split])} features",
                flush=True,
            )


def prepare(config, checkpoint_path: str | None = None, workdir: str | None = None):
    """-> (task, :class:`Pretrained`, BertConfig, vocab file, do_lower_case, tokenizer).

    From ``config.init_checkpoint`` (or ``workdir``'s record: :func:`load_checkpoint`), or from
    a fine-tuned params-only ``checkpoint_path``.
    """
    import tensorflow as tf

    tf.config.set_visible_devices([], "GPU")  # TensorFlow only tokenizes; keep it off the GPU.
    task = tasks.get_task(config)
    if checkpoint_path is None:
        pretrained, bert_config, vocab_file, lower = load_checkpoint(config, workdir)
    else:
        params, bert_config, meta = checkpoint.load_params(checkpoint_path)
        pretrained = Pretrained(None, False, params)
        bert_config = bert_config.replace(**model_overrides(config))
        vocab_file, lower = str(checkpoint.vocab_in(checkpoint_path, meta)), meta["do_lower_case"]
    tokenizer = tasks.load_tokenizer(vocab_file, lower)
    return task, pretrained, bert_config, vocab_file, lower, tokenizer


def existing_splits(task, config, splits) -> list[str]:
    return [s for s in splits if task.has_split(config.task.data_dir, s)]
