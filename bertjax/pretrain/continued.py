"""Continued pretraining: the run that ``config.init_checkpoint`` implies, and its initial params.

``config.init_checkpoint`` is any checkpoint ``bertjax.interop.formats`` reads: a bertjax
params-only checkpoint or training workdir (its newest verified step), a HuggingFace
``BertModel`` or ``BertForPreTraining`` directory, or Google's TF1 release. It is read once,
before anything is built, and :func:`resolve` makes the run config from it:

* **Architecture**: the checkpoint's :data:`ARCHITECTURE` fields replace ``config.model``'s. A
  field the command line set (``command_line``: the dotted keys the command's flags set, with
  their values) that disagrees with the checkpoint is an error naming both values. A
  'modernbert' checkpoint's RoPE bases (:data:`PHASE_DEFAULTS`) are taken too, unless the
  command line sets them (a context extension raises them). Dropout rates,
  the attention mask (``model.attention``: the left-to-right ablation is a way to train) and the
  runtime fields (dtypes, layout, remat, kernel) stay the config's.
* **Vocab and casing**: the checkpoint's, unless the command line sets ``data.vocab_file``: that
  must be the checkpoint's vocab by fingerprint (``bertjax.training.checkpoint.compare_vocab``;
  ``config.allow_vocab_change`` accepts a deliberate change). A ``data.do_lower_case`` set on the
  command line must agree with a casing the checkpoint records; a checkpoint that records none
  (TF1; HF without ``tokenizer_config.json``) takes it, else the casing its vocab implies
  (``bertjax.interop.converted.vocab_casing``).
* **Objective**: a 'modernbert' checkpoint was pretrained without NSP (ModernBERT's recipe),
  so its run is MLM only (``data.nsp`` False, ``train.nsp_loss_weight`` 0) unless the command
  line sets either (:func:`_modern_objective`); a BERT checkpoint keeps the config's objective.
* ``data.max_seq_length`` beyond the checkpoint's ``max_position_embeddings`` is an error.

**Heads** (:class:`Continued`): the checkpoint's ``encoder``, ``pooler``, ``mlm`` and ``nsp``
subtrees are the run's initial params. Those it lacks (a ``BertModel`` has no ``mlm`` or ``nsp``)
are drawn by the model's own init with the run's init key, which is the original's
(``run_pretraining.py``: truncated normal(0, initializer_range) kernels, zero biases and output
bias, unit LayerNorm scales; ``bertjax.training.compiled.init_state``). Other subtrees (a
fine-tuned classifier) are not used.

**Resume** (``workdir`` holds the run's record, format 3: ``bertjax.training.init_record``): the
architecture, vocab (``WORKDIR/vocab.txt``) and casing come from the record, checked against the
command line as above, and the init checkpoint is not read: :class:`Resumed` reads it only if no
step restores (``bertjax.pretrain.start``), from ``config.init_checkpoint`` or else the recorded
source, and only if it holds the recorded params (fingerprint). A ``config.init_checkpoint``
other than the recorded one is a notice: the record wins. A format-2 record (no init entry) is
resumed as before, by reading the checkpoint.

**Optimizer**: always a fresh state with the config's own warmup. HF releases carry no optimizer
state, and what Google's TF1 release and a bertjax workdir carry belongs to another run's
schedule and data. A fresh Adam's first updates move every weight by about the learning rate
whatever its gradient (m / sqrt(v) starts at sign(g); without bias correction at 3.2 sign(g)),
which would throw pretrained weights off before the moments settle: the warmup keeps those
updates small. (Continuing a bertjax run with its optimizer state is resuming it: rerun with its
workdir.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from etils import epath

from bertjax.interop import formats
from bertjax.interop.converted import Converted
from bertjax.model.config import SHAPE_FIELDS, BertConfig
from bertjax.model.encoder import stack_layers
from bertjax.training import checkpoint, init_record
from bertjax.training import workdir as workdir_lib

# The BertConfig fields a checkpoint decides: what function its weights compute, and how the
# original would initialise the heads it lacks.
ARCHITECTURE = (*SHAPE_FIELDS, "hidden_act", "layer_norm_eps", "initializer_range",
                "architecture", "global_attn_every_n_layers", "local_attention", "attention_bias",
                "mlp_bias", "norm_bias", "head_bias", "decoder_bias", "head_act")  # fmt: skip
# Taken from the checkpoint too, unless the command line sets them: a 'modernbert' model's RoPE
# bases, which a context extension raises (configs/modernbert_base.py, phase 2).
PHASE_DEFAULTS = ("global_rope_theta", "local_rope_theta")
# BertForPreTraining's top-level subtrees (bertjax.model.heads), in the order they are named.
SUBTREES = ("encoder", "pooler", "mlm", "nsp")


@dataclasses.dataclass(frozen=True)
class Continued:
    """What a run continued from ``source`` starts with when its workdir holds no checkpoint."""

    source: str  # config.init_checkpoint
    format: str  # bertjax.interop.formats.SOURCES
    params: dict  # numpy subtrees of SUBTREES the checkpoint has, in the run's layer layout
    unused: tuple[str, ...]  # the checkpoint's other subtrees (a fine-tuned head)
    record: init_record.InitRecord  # for the workdir's record

    @property
    def fresh(self) -> tuple[str, ...]:
        return tuple(name for name in SUBTREES if name not in self.params)

    def heads_line(self, initializer_range: float) -> str:
        loaded = ", ".join(name for name in SUBTREES if name in self.params)
        line = f"init_checkpoint {self.source} ({self.format}): loaded {loaded}; "
        if self.fresh:
            line += (
                f"initialised {', '.join(self.fresh)} as the original does (truncated "
                f"normal(0, {initializer_range:g}) kernels, zero biases, unit LayerNorm scales)"
            )
        else:
            line += "initialised none"
        return line + (f"; not used: {', '.join(self.unused)}" if self.unused else "")


def resolve(config, command_line: Mapping[str, Any], workdir: str | None = None):
    """-> (the run config, :class:`Continued`, :class:`Resumed` or None): ``config`` itself and
    None when ``config.init_checkpoint`` is empty and ``workdir`` holds no continued run; a
    :class:`Resumed` when it does (module docstring, Resume). Raises ValueError (one line naming
    the field and both values) as the module docstring says; ``bertjax.interop``'s ConvertError
    for a checkpoint it cannot read."""
    record = workdir_lib.read_record(workdir) if workdir else None
    init = init_record.resumed(record, str(config.init_checkpoint), workdir)
    if init is not None:
        return _from_record(config, command_line, record, init, workdir)
    if not config.init_checkpoint:
        return config, None
    source = str(config.init_checkpoint)
    fmt = formats.detect_format(source)
    given_lower = command_line.get("data.do_lower_case")
    conv = formats.load(source, fmt, do_lower_case=given_lower, casing_from_vocab=True)
    run = config.copy_and_resolve_references()
    why = "the architecture comes from the checkpoint"
    changes = _take_architecture(
        run, conv.config, f"config.init_checkpoint={source}", why, command_line
    )
    _take_vocab(run, conv, source, command_line)
    length = int(run.data.max_seq_length)
    if length > conv.config.max_position_embeddings:
        raise ValueError(
            f"config.data.max_seq_length={length} exceeds the max_position_embeddings="
            f"{conv.config.max_position_embeddings} of {source}"
        )
    casing = "lower-cased" if run.data.do_lower_case else "cased"
    print(
        f"init_checkpoint {source} ({fmt}): its architecture replaces config.model's "
        f"({', '.join(changes) or 'no change'}); vocab {run.data.vocab_file} "
        f"({conv.config.vocab_size} entries, {casing})",
        flush=True,
    )
    _modern_objective(run, conv.config, command_line)
    params = {name: conv.params[name] for name in SUBTREES if name in conv.params}
    fresh = [name for name in SUBTREES if name not in params]
    record = init_record.InitRecord.of(source, fmt, params, fresh)  # unscanned: the fingerprint
    if run.model.scan_layers:
        params["encoder"] = stack_layers(params["encoder"], conv.config.num_layers)
    unused = tuple(sorted(set(conv.params) - set(SUBTREES)))
    return run.lock(), Continued(source, fmt, params, unused, record)


@dataclasses.dataclass(frozen=True)
class Resumed:
    """A continued run resumed from its workdir's record: :meth:`load` reads the init
    checkpoint, which happens only when no step restores."""

    record: init_record.InitRecord
    init_checkpoint: str  # config.init_checkpoint: where to read ('' = the recorded source)
    workdir: str
    do_lower_case: bool  # the recorded casing (only TF1 needs it to be read)
    num_layers: int
    scan_layers: bool

    def load(self) -> Continued:
        """The checkpoint's params as the first start took them; CheckpointError (one line) if
        it is missing or holds other params (``init_record.reread``)."""
        found = {}

        def read(source: str) -> dict:
            found["format"] = formats.detect_format(source)
            conv = formats.load(source, found["format"], do_lower_case=self.do_lower_case,
                                casing_from_vocab=True)  # fmt: skip
            found["unused"] = tuple(sorted(set(conv.params) - set(SUBTREES)))
            return conv.params

        params = init_record.reread(self.record, self.init_checkpoint, self.workdir, read)
        if self.scan_layers:
            params["encoder"] = stack_layers(params["encoder"], self.num_layers)
        source = self.init_checkpoint or self.record.source
        return Continued(source, found["format"], params, found["unused"], self.record)


def _from_record(config, command_line, record: dict, init, workdir: str):
    """(run config, :class:`Resumed`): the architecture, vocab and casing of ``workdir``'s
    record in place of the checkpoint's, checked against the command line as at a first start."""
    run = config.copy_and_resolve_references()
    recorded: BertConfig = record["bert_config"]
    origin = str(epath.Path(workdir) / checkpoint.CONFIG_FILE)
    changes = _take_architecture(run, recorded, origin, "a resumed run keeps its architecture",
                                 command_line)  # fmt: skip
    given_lower = command_line.get("data.do_lower_case")
    if given_lower is not None and bool(given_lower) != record["do_lower_case"]:
        raise ValueError(
            f"--config.data.do_lower_case={given_lower} disagrees with {workdir}/"
            f"{workdir_lib.META_FILE}, whose run is "
            f"{'lower-cased' if record['do_lower_case'] else 'cased'}"
        )
    run.data.do_lower_case = record["do_lower_case"]
    if "data.vocab_file" not in command_line:  # one given is checked against the record
        run.data.vocab_file = str(checkpoint.vocab_in(workdir, record))
    run.data.tokenizer = checkpoint.tokenizer_kind(run.data.vocab_file)
    length = int(run.data.max_seq_length)
    if length > recorded.max_position_embeddings:
        raise ValueError(
            f"config.data.max_seq_length={length} exceeds the max_position_embeddings="
            f"{recorded.max_position_embeddings} of {origin}"
        )
    casing = "lower-cased" if run.data.do_lower_case else "cased"
    print(
        f"resuming {workdir}, continued from {init.source} ({init.format}): its record's "
        f"architecture replaces config.model's ({', '.join(changes) or 'no change'}); vocab "
        f"{run.data.vocab_file} ({record['vocab']['entries']} entries, {casing})",
        flush=True,
    )
    _modern_objective(run, recorded, command_line)
    resumed = Resumed(init, str(config.init_checkpoint), workdir, run.data.do_lower_case,
                      recorded.num_layers, bool(run.model.scan_layers))  # fmt: skip
    return run.lock(), resumed


def _take_architecture(run, found: BertConfig, origin: str, why: str, command_line) -> list[str]:
    """Sets ``run.model``'s :data:`ARCHITECTURE` to ``found``'s; returns the changes made.
    ``origin`` (where ``found`` came from) and ``why`` are for the error."""
    changes = []
    for field in ARCHITECTURE:
        value, key = getattr(found, field), f"model.{field}"
        if key in command_line and command_line[key] != value:
            raise ValueError(
                f"--config.{key}={command_line[key]} disagrees with {origin}, whose {field} is "
                f"{value} ({why}; drop the flag)"
            )
        if run.model[field] != value:
            changes.append(f"{field} {run.model[field]} -> {value}")
            run.model[field] = value
    for field in PHASE_DEFAULTS if found.is_modern else ():
        value = getattr(found, field)
        if f"model.{field}" not in command_line and run.model[field] != value:
            changes.append(f"{field} {run.model[field]} -> {value}")
            run.model[field] = value
    return changes


def _modern_objective(run, found: BertConfig, command_line) -> None:
    """MLM without NSP for a 'modernbert' checkpoint (module docstring, Objective), with a line
    saying so; the config's objective for BERT, or when the command line sets NSP's keys."""
    nsp_keys = ("data.nsp", "train.nsp_loss_weight")
    if not found.is_modern or any(key in command_line for key in nsp_keys):
        return
    if run.data.nsp or float(run.train.nsp_loss_weight):
        run.data.nsp, run.train.nsp_loss_weight = False, 0.0
        print(
            "objective: MLM without NSP, as the 'modernbert' checkpoint was pretrained "
            "(data.nsp=False, train.nsp_loss_weight=0; set them on the command line to change it)",
            flush=True,
        )


def _take_vocab(run, conv: Converted, source: str, command_line) -> None:
    """Sets ``run.data``'s vocab file and casing: the checkpoint's, or checked against it."""
    given_lower = command_line.get("data.do_lower_case")
    if given_lower is not None and bool(given_lower) != conv.do_lower_case:
        kind = "lower-cased" if conv.do_lower_case else "cased"
        raise ValueError(
            f"--config.data.do_lower_case={given_lower} disagrees with config.init_checkpoint="
            f"{source}, which is {kind}"
        )
    run.data.do_lower_case = conv.do_lower_case
    given_vocab = command_line.get("data.vocab_file")
    if given_vocab is None:
        run.data.vocab_file = conv.vocab_file
    elif not run.allow_vocab_change and not run.train.synthetic_data:
        recorded = checkpoint.vocab_fingerprint(conv.vocab_file)
        checkpoint.compare_vocab(recorded, conv.vocab_file, given_vocab, "config.data.vocab_file")
    run.data.tokenizer = checkpoint.tokenizer_kind(run.data.vocab_file)  # a BPE: tokenizer.json
