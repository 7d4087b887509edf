"""What bench/accelerator_check.py times, and what its device time is expected to be. No JAX.

**Workloads.** Two kinds, each timed in the process of the framework that runs it:

* ``contract``: the peers' fp32 contract (``../shared/bench/peers/workloads.json``'s common
  hyper-parameters: fp32, exact GELU, AdamW, dropout 0.1, synthetic full rows from the harness's
  ``common.make_batch``), run by bertjax (``bench/step_bertjax.py``'s model with attention
  'auto' as a run has it: the Pallas kernel on a GPU or TPU, XLA on CPU; ``bertjax-xla``: the
  XLA attention) and by HF Flax (the harness's ``step_flax.py``).
* ``config``: a shipped config file (``configs/bert_base.py``, ``configs/large.py``,
  ``configs/modernbert_base.py`` with its ``get_config`` argument) as it ships
  (bf16 compute with fp32 params, tanh GELU, attention 'auto', the BERT Adam with clipping and
  warmup, ``pretrain.objective.build_steps``: what ``python -m bertjax.main`` compiles) with only
  the batch changed: rows of synthetic instances (:func:`instance_rows`), one per row padded to
  ``L``, or packed as the config packs (``data.max_sequences_per_pack``; the batch contract's
  packed row, built by ``bertjax.data.packing``).

Each is timed at the first batch of its list that does not run out of memory.

**Device time** (:func:`estimate`): process start + the sections + per workload, its build (state,
compile; for HF Flax also its model init) + ``warmup + measure`` steps. The constants below are
seconds on one H200 with a cold compilation cache, from ``bench/results/h200-2026-11-26/`` (its
``log.txt``, the ``.json``'s per-shape seconds, ``large512_rest.json``) and the closing note of
that session (530 s in all for the probe, the self-check, the equality tests and four and a bit
harness processes of about 90 s each); where that log does not separate two costs the split is
an assumption and says so. Every run records what each item took (``seconds`` in its results),
so the next lease can replace them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import pathlib

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]

# ---- device-time constants, seconds (module docstring) ----
ORCHESTRATION_S = 2.0  # this parent process: Python and no JAX (measured on CPU, 2026-11-28)
# A framework's process before its first section: Python, JAX and the CUDA client, bertjax or
# transformers imported. Assumption: the H200 log does not separate it from the compile.
PROCESS_START_S = {"bertjax": 20.0, "hf-flax": 25.0}
# Per self-check shape (head_dim, dtype, causal): the H200 .json's 'seconds'; the first shape run
# also pays the GPU runtime's first use (12.5 s against 5.2 s for the next).
SELF_CHECK_S = {
    (64, "float32", False): 12.5, (64, "bfloat16", False): 5.2, (64, "bfloat16", True): 3.5,
    (128, "float32", False): 6.9, (128, "bfloat16", True): 5.8, (32, "bfloat16", False): 7.6,
}  # fmt: skip
DEVICE_TESTS_S = 35.1  # pytest's own figure for the 12 native GPU cases (log.txt)
# A workload's build up to its first timed step (bertjax: lower, compile, state init, batch; HF
# Flax: model init, first step). bertjax BERT-base: a harness process of about
# 90 s, less its start (20), 13 steps at 0.118 s and the kernel check's first compare (12.5).
# BERT-large: twice the layers to compile (its XLA-attention process did not finish start,
# compile and 13 steps in 95 s). HF Flax: BERT-large's first step took 39.2 s
# (large512_rest.json 'compile_s') and its process about 90 s: 39 + 20 s of model init; BERT-base
# is taken at the same 60 s (an upper bound: no figure of its own).
# ModernBERT-base (22 layers, not scanned: local and global layers differ): assumed as
# BERT-large's 100 s, no device has built it yet.
BUILD_S = {("bertjax", "base"): 56.0, ("bertjax", "large"): 100.0, ("bertjax", "modern"): 100.0,
           ("hf-flax", "base"): 60.0, ("hf-flax", "large"): 60.0}  # fmt: skip
# Step seconds at the first batch: the H200 table (fp32, base128 b256: bertjax 0.118, HF Flax
# 0.126; large512 b64: 0.421 and 0.459, halved for b32). bf16 was never timed: fp32's time for
# as many tokens is its bound (at 512 attention adds 8% to BERT-base's FLOPs per token).
# ModernBERT-base at 1,024, 32 packed rows: at Ettin-150M's published 0.30M tokens/s per H100
# (the same architecture and size), 32,768 token slots take 0.109 s; never timed here.
STEP_S = {("bertjax", "base128"): 0.118, ("hf-flax", "base128"): 0.126,
          ("bertjax", "large512"): 0.211, ("hf-flax", "large512"): 0.230,
          ("bertjax", "base512"): 0.13, ("bertjax", "modern1024"): 0.109}  # fmt: skip
ETTIN_150M_TOKENS_PER_S = 0.30e6  # per H100, published (Ettin, 2025): the modern figure to beat
BUDGET_S = 360.0  # issue #37 item 9: the default full run fits 6 minutes of one GPU


@dataclasses.dataclass(frozen=True)
class Workload:
    kind: str  # 'contract' | 'config' (module docstring)
    batches: tuple[int, ...]  # rows per step to try, largest first
    impls: tuple[str, ...]  # every impl it can run; the default run takes default_impls
    default_impls: tuple[str, ...]
    shape: dict  # contract: the harness's workload fields; config: config.model overrides
    config: str = ""  # kind 'config': the file under configs/
    config_arg: str = ""  # its get_config argument ('base,1': configs/modernbert_base.py)
    length: int = 0  # kind 'config' overrides: L and P (0: the config's)
    predictions: int = 0
    packed: bool = False
    warmup_steps: int = 3
    measure_steps: int = 10
    size: str = "base"  # for BUILD_S
    timing: str = ""  # for STEP_S ('' in tiny mode: no estimate)


def _base(layers=12, hidden=768, heads=12, ffn=3072) -> dict:
    return dict(layers=layers, hidden=hidden, heads=heads, ffn=ffn)


WORKLOADS = {
    "base128-fp32": Workload("contract", (256, 128), ("bertjax", "bertjax-xla", "hf-flax"),
                             ("bertjax", "hf-flax"), {**_base(), "seq": 128}, timing="base128"),
    "large512-fp32": Workload("contract", (32, 16), ("bertjax", "bertjax-xla", "hf-flax"), (),
                              {**_base(24, 1024, 16, 4096), "seq": 512}, size="large",
                              timing="large512"),
    "base512-bf16": Workload("config", (64, 32), ("bertjax",), ("bertjax",), {},
                             config="bert_base.py", timing="base512"),
    "base512-bf16-packed": Workload("config", (64, 32), ("bertjax",), ("bertjax",), {},
                                    config="bert_base.py", packed=True, timing="base512"),
    "large512-bf16": Workload("config", (32, 16), ("bertjax",), (), {}, config="large.py",
                              size="large", timing="large512"),
    # ModernBERT-base's phase 1 as it ships (packed rows of 1,024, the window, StableAdamW), at
    # a batch of rows; outside the default run (its build alone would pass the 6 minutes):
    # --workloads=modern1024-bf16.
    "modern1024-bf16": Workload("config", (32, 16), ("bertjax",), (), {},
                                config="modernbert_base.py", config_arg="base,1", packed=True,
                                size="modern", timing="modern1024"),
}  # fmt: skip
# --tiny (CPU, a test of the check): the same kinds on a one-layer model, a few steps.
_TINY_MODEL = dict(num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64,
                   vocab_size=1100)  # fmt: skip
TINY_WORKLOADS = {
    "tiny32-fp32": Workload("contract", (4,), ("bertjax", "bertjax-xla", "hf-flax"),
                            ("bertjax", "hf-flax"), dict(layers=1, hidden=32, heads=2, ffn=64,
                            seq=32, vocab_size=1100, n_masked=4), warmup_steps=1,
                            measure_steps=2),
    "tiny32-bf16": Workload("config", (4,), ("bertjax",), ("bertjax",), _TINY_MODEL,
                            config="bert_base.py", length=32, predictions=4, warmup_steps=1,
                            measure_steps=2),
    "tiny32-bf16-packed": Workload("config", (4,), ("bertjax",), ("bertjax",), _TINY_MODEL,
                                   config="bert_base.py", length=32, predictions=4, packed=True,
                                   warmup_steps=1, measure_steps=2),
    # A global and a local layer (window 16 < L), MLM only at 30%: the modern recipe's kind.
    "tiny64-modern": Workload("config", (4,), ("bertjax",), ("bertjax",),
                              {**_TINY_MODEL, "num_layers": 2, "local_attention": 16},
                              config="modernbert_base.py", config_arg="ettin-17m,1", length=64,
                              predictions=19, packed=True, warmup_steps=1, measure_steps=2),
}  # fmt: skip
# (head_dim, dtype, causal), dropout 0.1. Every paper size has D = 64 (bertjax.model.config
# SIZES); the first two are the timed workloads' settings (which skip the trainer's own start-up
# check: run self_check in the same lease); D = 128 stands for other models. The H200's D=128
# float32 and D=32 shapes are left to the equality tests (D 24 padded to 32, 64; both dtypes).
SELF_CHECK_SHAPES = [(64, "float32", False), (64, "bfloat16", False), (64, "bfloat16", True),
                     (128, "bfloat16", True)]  # fmt: skip
TINY_SELF_CHECK_SHAPES = [(32, "bfloat16", True)]


def framework(impl: str) -> str:
    """The process an impl runs in: 'bertjax' or 'hf-flax'."""
    return "hf-flax" if impl == "hf-flax" else "bertjax"


def items(workloads: dict, names: list[str], impls: list[str]) -> list[tuple[str, str]]:
    """(workload, impl) in run order: ``names`` (default: every workload with default impls)
    and ``impls`` (default: each workload's default impls, or all its impls when named)."""
    chosen = []
    for name, w in workloads.items():
        if names and name not in names:
            continue
        runs = w.impls if names else w.default_impls
        chosen += [(name, impl) for impl in runs if not impls or impl in impls]
    return chosen


@dataclasses.dataclass(frozen=True)
class Cost:
    key: str  # the results' "seconds" key that measures it
    what: str
    seconds: float
    source: str


def estimate(sections: list[str], steps: list[tuple[str, str]], shapes) -> list[Cost]:
    """The device time of a full-mode run, item by item (module docstring)."""
    costs = [Cost("orchestration", "orchestration", ORCHESTRATION_S, "parent process, no JAX")]
    runs = {fw: [s for s in steps if framework(s[1]) == fw] for fw in PROCESS_START_S}
    for fw, fw_steps in runs.items():
        if fw_steps or (fw == "bertjax" and {"self_check", "device_tests"} & set(sections)):
            costs.append(
                Cost(f"start:{fw}", f"{fw} process start", PROCESS_START_S[fw], "assumption")
            )
        if fw == "bertjax" and "self_check" in sections:
            seconds = sum(SELF_CHECK_S[tuple(shape)] for shape in shapes)
            what = f"self_check, {len(shapes)} shapes"
            costs.append(Cost("self_check", what, seconds, "H200 .json, per shape"))
        if fw == "bertjax" and "device_tests" in sections:
            what, source = "device_tests", "H200 log.txt, pytest's own time"
            costs.append(Cost("device_tests", what, DEVICE_TESTS_S, source))
        for name, impl in fw_steps:
            w = WORKLOADS[name]
            build = BUILD_S[(fw, w.size)]
            step = STEP_S.get((fw, w.timing), STEP_S[("bertjax", w.timing)])
            count = w.warmup_steps + w.measure_steps
            what, source = (
                f"{name} {impl}: build + {count} steps",
                f"build {build:.0f} + {count} x {step} s",
            )
            costs.append(Cost(f"step:{name}:{impl}", what, build + count * step, source))
    return costs


def describe(costs: list[Cost]) -> str:
    """The estimate as the check prints it before it starts."""
    total = sum(c.seconds for c in costs)
    lines = [f"  {c.seconds:6.1f} s  {c.what} ({c.source})" for c in costs]
    verdict = "within" if total <= BUDGET_S else "OVER"
    head = (
        f"estimated device time: {total:.0f} s ({total / 60:.1f} min, cold compilation cache; "
        f"{verdict} the {BUDGET_S:.0f} s budget; constants: bench/step_workloads.py)"
    )
    return "\n".join([head, *lines])


def write_harness_workloads(path, peers_file, steps, tiny: bool) -> None:
    """The peers' workloads.json (``peers_file``'s common hyper-parameters) at ``path``, with
    the contract workloads of ``steps``, one per (name, batch): ``<name>_b<batch>``."""
    workloads = TINY_WORKLOADS if tiny else WORKLOADS
    entries = {}
    for name in dict(steps):
        w = workloads[name]
        for batch in w.batches if w.kind == "contract" else ():
            entries[f"{name}_b{batch}"] = {
                **w.shape, "batch": batch, "warmup_steps": w.warmup_steps,
                "measure_steps": w.measure_steps, "desc": f"{name} b{batch} (accelerator_check)",
            }  # fmt: skip
    common = json.loads(pathlib.Path(peers_file).read_text())["common"]
    pathlib.Path(path).write_text(json.dumps({"common": common, "workloads": entries}, indent=1))


# ---- synthetic batches (numpy; the lent machine has no TensorFlow) ----


def load_config(name: str, arg: str = ""):
    """``configs/<name>``'s ``get_config(arg)`` (no argument when ``arg`` is ''), unlocked for
    the batch overrides."""
    spec = importlib.util.spec_from_file_location(f"configs_{name[:-3]}", REPO / "configs" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(arg) if arg else module.get_config()
    config.unlock()
    return config


def config_for(w: Workload, rows: int):
    """The workload's shipped config with only the batch, its L and P (tiny mode: K stays the
    shipped one) and its model's size (tiny mode) changed; packing on for packed workloads.
    ``rows`` goes into ``train.global_batch_size``, which ``build_steps`` compiles as rows
    (``python -m bertjax.main`` resolves a packed run's instances into rows before it:
    ``pretrain.inputs.resolve_packed_batch``)."""
    config = load_config(w.config, w.config_arg)
    config.model.update(w.shape)
    if w.length:  # K stays the shipped config's (16 at 512): ceil(32 / 32) would be 1
        shipped_k = config.data.max_sequences_per_pack
        config.data.max_seq_length, config.data.max_predictions_per_seq = w.length, w.predictions
        config.data.max_sequences_per_pack = shipped_k
    config.data.pack_sequences = w.packed
    config.train.global_batch_size = rows
    # Every step at this batch, in one micro-batch: no batch-size warm-up (ModernBERT's), whose
    # smaller batches would each compile.
    config.train.update(batch_warmup_tokens=0, grad_accum_steps=1)
    return config


def instance_lengths(count: int, length: int, short_seq_prob: float, seed: int) -> np.ndarray:
    """Token counts of ``count`` pretraining instances, [CLS] and [SEP]s included, as
    ``create_pretraining_data`` cuts documents: each document in pieces of at most ``L - 3``
    tokens, a shorter random target with ``short_seq_prob``. Document lengths: the log-normal of
    ``bench/wikipedia_like_corpus.py`` (median 300 words, mean 650), one token per word."""
    import wikipedia_like_corpus  # bench/, beside this file

    rng = np.random.default_rng(seed)
    out: list[int] = []
    while len(out) < count:
        (left,) = wikipedia_like_corpus.document_lengths(1, int(rng.integers(1 << 31)))
        while left > 0 and len(out) < count:
            target = length - 3
            if rng.random() < short_seq_prob:
                target = int(rng.integers(2, length - 2))
            taken = min(target, int(left))
            out.append(taken + 3)
            left -= taken
    return np.asarray(out)


def instance_rows(config, rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``rows`` rows of the batch contract (``bertjax.data.pipeline``) for ``config``: synthetic
    instances (:func:`instance_lengths`; random ids, ``masked_lm_prob`` of each instance's tokens
    predicted, at most P), one per row padded to L, or packed (``config.data.pack_sequences``)
    by ``bertjax.data.packing`` into rows of up to K instances."""
    from bertjax.data import packing

    data, vocab = config.data, int(config.model.vocab_size)
    length, preds = int(data.max_seq_length), int(data.max_predictions_per_seq)
    k = int(data.max_sequences_per_pack) if data.pack_sequences else 1
    count = rows * k * 2 if data.pack_sequences else rows  # more than the rows take
    lengths = instance_lengths(count, length, float(data.short_seq_prob), seed)
    rng = np.random.default_rng(seed + 1)
    features = {name: np.zeros((count, length), np.int32) for name in
                ("input_ids", "segment_ids", "input_mask")}  # fmt: skip
    features.update(masked_lm_positions=np.zeros((count, preds), np.int32),
                    masked_lm_ids=np.zeros((count, preds), np.int32),
                    masked_lm_weights=np.zeros((count, preds), np.float32),
                    next_sentence_labels=rng.integers(0, 2, count).astype(np.int32))  # fmt: skip
    predicted = np.minimum(preds, np.maximum(1, np.round(lengths * float(data.masked_lm_prob))))
    for i, (n, m) in enumerate(zip(lengths, predicted.astype(int), strict=True)):
        features["input_ids"][i, :n] = rng.integers(min(1000, vocab // 2), vocab, n)
        features["segment_ids"][i, n // 2 : n] = 1
        features["input_mask"][i, :n] = 1
        features["masked_lm_positions"][i, :m] = np.sort(rng.choice(np.arange(1, n), m, False))
        features["masked_lm_ids"][i, :m] = rng.integers(min(1000, vocab // 2), vocab, m)
        features["masked_lm_weights"][i, :m] = 1.0
    if not data.pack_sequences:
        return features
    packed = packing.pack(lengths, predicted, length, k, preds)
    return {key: value[:rows] for key, value in packing.pack_features(features, packed, k).items()}


def row_counts(batch: dict[str, np.ndarray]) -> dict:
    """Instances and real tokens of a host batch, counted on the host."""
    if "instance_weights" in batch:
        instances = int(np.sum(batch["instance_weights"] > 0))
    else:
        instances = len(batch["input_ids"])
    tokens = int(np.sum(batch["input_mask"] != 0))
    rows, length = batch["input_ids"].shape
    return {"rows": rows, "instances": instances, "tokens": tokens,
            "efficiency": tokens / (rows * length)}  # fmt: skip
