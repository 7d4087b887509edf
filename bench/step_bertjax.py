"""bertjax's pretraining train step (the trainer core's bertjax.training.step.train_step with the
pretraining objective, jitted once) on the shared workloads, beside the peers of
../shared/bench/peers (copy it there; bench/run_steps.sh does).

# venv: bertjax
# variants: jit mimalloc jemalloc tcmalloc hugepages fulllast xlaattention plainforms

Usage: python step_bertjax.py --workload W1 [--variant jit]. While `import bertjax` fails this
records 'skipped' and exits 3, so run_all.sh keeps going.

Variants: ``jit`` is exactly what ``python -m bertjax.main`` runs (glibc's malloc, the last encoder
layer at [CLS] and the masked positions only). The allocator variants are ``jit`` in a process
started with another well-kept malloc preloaded (the opt-in documented in the README: XLA:CPU
mallocs each step's large temporary buffer and glibc unmaps it after the step, so every step
faults it in again): ``mimalloc`` (the ``cmeel-mimalloc`` wheel), ``jemalloc`` and ``tcmalloc``
(Debian's libjemalloc2 / libtcmalloc-minimal4), ``hugepages`` (glibc with
``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``: transparent huge pages for malloc's mmaps). A variant
whose library is missing records 'skipped'. ``fulllast`` runs the last layer at every position
(``model.gather_last_layer=False``). ``xlaattention`` runs attention as XLA ops
(``model.attention_impl='xla'``) where ``jit`` runs the platform's fused kernel ('auto': the
Pallas flash kernels on TPU and GPU, XLA on CPU, so on CPU the two are the same program); ``fused``
asks for the fused kernel everywhere (``'fused'``: as ``jit`` on TPU and GPU, the TPU kernel in
Pallas interpret mode on CPU, which only tests the harness: never a timing; so it is not on the
variants line that run_all.sh runs; bench/accelerator_check.py runs it).
``plainforms`` runs the model without its XLA:CPU forms (``cpu_forms=False``:
``bertjax.model.cpu_forms``), which ``jit`` gets as every CPU step does. The
notes give the median minor page faults and system CPU seconds per measured step
(``getrusage``), where allocators differ.

build_step() keeps the contract shared by every step_*.py: shapes and hyper-parameters from
common.load_workload(name), inputs from common.make_batch(w), MLM on the gathered positions +
NSP, fp32, one jitted step that blocks until done and returns the loss, reported with
common.emit_step("bertjax-<variant>", ...).
"""

import argparse
import os
import resource
import statistics
import sys

import common


def contract_bert_config(w, variant, attention_check=True):
    """The workload's model as the peers' contract has it (fp32, HF's exact GELU)."""
    from bertjax.model.config import BertConfig

    return BertConfig(
        vocab_size=w["vocab_size"],
        hidden_size=w["hidden"],
        num_layers=w["layers"],
        num_heads=w["heads"],
        intermediate_size=w["ffn"],
        max_position_embeddings=w["max_position_embeddings"],
        type_vocab_size=w["type_vocab_size"],
        hidden_dropout_rate=w["hidden_dropout_prob"],
        attention_dropout_rate=w["attention_probs_dropout_prob"],
        hidden_act="gelu",  # the peers run HF's default (exact) GELU
        gather_last_layer=variant != "fulllast",
        attention_impl={"xlaattention": "xla", "fused": "fused"}.get(variant, "auto"),
        attention_check=attention_check,
    )


def contract_trainer(w, variant, mesh, attention_check=True):
    """(the trainer, the host batch) of the workload's contract on ``mesh``: nothing allocated
    on the devices yet (bench/accelerator_check.py compiles and times it in its own process)."""
    import ml_collections
    import numpy as np

    from bertjax.model.heads import BertForPreTraining
    from bertjax.pretrain import objective as objective_lib
    from bertjax.training import compiled, optimizer
    from bertjax.training import sharding as sh
    from bertjax.training.step import StepConfig

    bert_config = contract_bert_config(w, variant, attention_check)
    # The workload's optimizer: optax-style AdamW, no clipping, constant lr.
    opt_config = ml_collections.ConfigDict(
        dict(
            name="adamw",
            learning_rate=w["lr"],
            warmup_steps=0,
            schedule="constant",
            beta1=w["adam_b1"],
            beta2=w["adam_b2"],
            eps=w["adam_eps"],
            weight_decay=w["weight_decay"],
            max_grad_norm=0.0,
        )
    )
    model_config = sh.bert_config_for(bert_config, mesh)  # as build_steps fits it to the mesh
    if variant == "plainforms":
        model_config = model_config.replace(cpu_forms=False)
    seq, masked = w["seq"], w["n_masked"]
    trainer = compiled.build_trainer(
        objective_lib.Pretraining(BertForPreTraining(model_config), seq, masked),
        optimizer.create_optimizer(opt_config, 1),
        optimizer.learning_rate_schedule(opt_config, 1),
        StepConfig(),
        mesh,
        sh.DEFAULT_RULES,
        objective_lib.abstract_batch(w["batch"], seq, masked),
    )
    peer = common.make_batch(w)
    host_batch = {
        "input_ids": peer["input_ids"],
        "segment_ids": peer["token_type_ids"],
        "input_mask": peer["attention_mask"],
        "masked_lm_positions": peer["masked_lm_positions"],
        "masked_lm_ids": peer["masked_lm_ids"],
        "masked_lm_weights": np.ones(peer["masked_lm_ids"].shape, np.float32),
        "next_sentence_labels": peer["next_sentence_labels"],
    }
    return trainer, host_batch


def build_step(w, variant):
    """Return a zero-arg callable doing one full train step and returning a float loss."""
    import jax

    from bertjax.training import sharding as sh

    mesh = sh.create_mesh((1, 1, 1), jax.devices()[:1])
    trainer, host_batch = contract_trainer(w, variant, mesh)
    step_fn = trainer.train_step
    state = trainer.init_state(jax.random.key(w["seed"]))
    batch = sh.make_global_batch(host_batch, mesh)
    rng = jax.random.key_data(jax.random.key(1))
    holder = {"state": state}

    def step():
        before = resource.getrusage(resource.RUSAGE_SELF)
        holder["state"], metrics = step_fn(holder["state"], batch, rng)
        loss = float(metrics["loss_sum"])
        after = resource.getrusage(resource.RUSAGE_SELF)
        step.rusage.append((after.ru_minflt - before.ru_minflt, after.ru_stime - before.ru_stime))
        return loss

    step.rusage = []  # (minor page faults, system CPU s) of each call
    return step


ALLOCATORS = {  # variant -> shared library preloaded in its place
    "jemalloc": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "tcmalloc": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
}


def _library(variant: str) -> str:
    if variant == "mimalloc":
        import importlib.metadata

        files = importlib.metadata.files("cmeel-mimalloc") or []
        found = [f.locate() for f in files if str(f).endswith("lib/libmimalloc.so")]
        if not found:
            raise FileNotFoundError("cmeel-mimalloc is not installed (pip install cmeel-mimalloc)")
        return str(found[0])
    if not os.path.exists(ALLOCATORS[variant]):
        raise FileNotFoundError(f"{ALLOCATORS[variant]} is missing (apt-get install ...)")
    return ALLOCATORS[variant]


def _with_allocator(variant: str) -> str:
    """Re-executes this process once with the variant's malloc; returns what runs."""
    if variant not in (*ALLOCATORS, "mimalloc", "hugepages"):
        return "glibc (as python -m bertjax.main)"
    env = dict(os.environ)
    if variant == "hugepages":
        env["GLIBC_TUNABLES"] = "glibc.malloc.hugetlb=1"
        described = "glibc with glibc.malloc.hugetlb=1"
    else:
        env["LD_PRELOAD"] = _library(variant)
        described = f"{variant} ({env['LD_PRELOAD']})"
    if os.environ.get("BERTJAX_BENCH_ALLOCATOR") != variant:
        env["BERTJAX_BENCH_ALLOCATOR"] = variant
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    return described


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True)
    ap.add_argument("--variant", default="jit")
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--steps", type=int)
    args = ap.parse_args()
    w = common.load_workload(args.workload)
    impl = f"bertjax-{args.variant}"
    try:
        malloc = _with_allocator(args.variant)
        step = build_step(w, args.variant)
    except (ImportError, NotImplementedError, FileNotFoundError) as e:
        common.emit_skip("step", impl, f"{type(e).__name__}: {e}", w["name"])
        return 3
    warmup = args.warmup if args.warmup is not None else w["warmup_steps"]
    n = args.steps if args.steps is not None else w["measure_steps"]
    first, warm, meas, losses = common.time_steps(step, warmup, n)
    import jax

    import bertjax

    measured = step.rusage[-n:] if n else [(0, 0.0)]
    faults = statistics.median(f for f, _ in measured)
    sys_s = statistics.median(s for _, s in measured)
    versions = {
        "jax": jax.__version__,
        "bertjax": getattr(bertjax, "__version__", "?"),
        "backend": jax.default_backend(),
    }
    common.emit_step(
        impl,
        w,
        first,
        warm,
        meas,
        losses,
        versions,
        notes=(
            f"first step includes jit compile; malloc: {malloc}; per measured step "
            f"(median): {faults:.0f} minor page faults, {sys_s:.2f} s system CPU"
        ),
        extra={"compile_s": first},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
