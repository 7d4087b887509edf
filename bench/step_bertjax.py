"""bertjax's pretraining train step (bertjax.train.train_step, jitted once) on the shared workloads.

# venv: bertjax
# variants: jit xla blas nocache defaultmalloc fulllast

Usage: copy next to ../shared/bench/peers/common.py, then python step_bertjax.py --workload W1
While `import bertjax` fails this records 'skipped' and exits 3, so run_all.sh keeps going.
Variants: ``jit`` is the default configuration (``model.matmul='auto'``: on this one-device CPU
process the MKL GEMM kernel of bertjax/cpu_gemm.py on an Intel CPU, XLA's own dots elsewhere);
``xla`` and ``blas`` pin ``model.matmul`` to XLA's dot kernels or the MKL kernel for the
side-by-side comparison (the notes say which one ``jit`` picked and why). Like ``python -m
bertjax.main``, every variant first re-executes itself with transparent huge pages for malloc's
large blocks and bertjax's big-block cache preloaded (``bertjax.cpu_malloc.reexec_with_huge_pages``:
XLA's per-step temporary buffer is then reused from step to step instead of faulting in again),
except ``nocache``, which is ``jit`` with the huge pages only (``BERTJAX_CPU_MALLOC=hugepages``),
and ``defaultmalloc``, which is ``jit`` with glibc's defaults, to show what each is worth, and
``fulllast``, which is ``jit`` with the last encoder
layer run at every position (``model.gather_last_layer=False``; by default pretraining runs it
only at [CLS] and the masked positions, which the heads read). The notes give the median minor
page faults and system CPU seconds per measured step (``getrusage``), where that difference
shows.
build_step() uses bertjax's own model, losses and optimizer (``bertjax.train.train_step``
jitted once with donated state, one CPU device), keeping the contract shared by every step_*.py:
  * shapes and hyper-parameters from common.load_workload(name) (layers, hidden, heads, ffn,
    seq, batch, vocab_size, n_masked, dropout, AdamW settings),
  * inputs from common.make_batch(w) (same synthetic ids/positions/labels as the peers),
  * MLM loss on the n_masked gathered positions + NSP loss, fp32, one jitted step,
  * step() must block until the step is done (e.g. float(loss)) and return the loss,
  * report with common.emit_step("bertjax-<variant>", ...).
"""

import argparse
import os
import resource
import statistics
import sys

import common


def build_step(w, variant):
    """Return a zero-arg callable doing one full train step and returning a float loss."""
    import jax
    import ml_collections
    import numpy as np

    from bertjax import cpu_gemm, optimizer, train
    from bertjax import sharding as sh
    from bertjax.heads import BertForPreTraining
    from bertjax.model import BertConfig

    matmul = variant if variant in cpu_gemm.MATMULS else "auto"
    bert_config = BertConfig(
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
        matmul=cpu_gemm.resolve(matmul),
        gather_last_layer=variant != "fulllast",
    )
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
    model = BertForPreTraining(bert_config)
    tx = optimizer.create_optimizer(opt_config, 1)
    schedule = optimizer.learning_rate_schedule(opt_config, 1)
    mesh = sh.create_mesh((1, 1, 1), jax.devices()[:1])
    seq, masked = w["seq"], w["n_masked"]
    _, shardings = train.state_shardings(model, tx, mesh, sh.DEFAULT_RULES, seq, masked)
    state = train.init_train_state(model, tx, shardings, jax.random.key(w["seed"]), seq, masked)
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
    step_fn = train.jit_train_step(
        model,
        tx,
        schedule,
        train.StepConfig(),
        mesh,
        sh.DEFAULT_RULES,
        shardings,
        train.abstract_batch(w["batch"], seq, masked),
    )
    batch = train.make_global_batch(host_batch, mesh)
    rng = jax.random.key_data(jax.random.key(1))
    holder = {"state": state}

    def step():
        before = resource.getrusage(resource.RUSAGE_SELF)
        holder["state"], metrics = step_fn(holder["state"], batch, rng)
        loss = float(metrics["loss_sum"])
        after = resource.getrusage(resource.RUSAGE_SELF)
        step.rusage.append((after.ru_minflt - before.ru_minflt, after.ru_stime - before.ru_stime))
        return loss

    step.matmul = cpu_gemm.describe(matmul)
    step.rusage = []  # (minor page faults, system CPU s) of each call
    return step


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
        from bertjax import cpu_malloc

        if args.variant == "nocache":
            os.environ[cpu_malloc.ENV_SWITCH] = cpu_malloc.HUGE_PAGES_ONLY
        if args.variant != "defaultmalloc":
            cpu_malloc.reexec_with_huge_pages()  # what `python -m bertjax.main` does first
        malloc = cpu_malloc.status()
        same_as_jit = ("defaultmalloc", "nocache")
        step = build_step(w, "jit" if args.variant in same_as_jit else args.variant)
    except (ImportError, NotImplementedError) as e:
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
    cache = cpu_malloc.cache_stats()
    cache_note = ""
    if cache:
        cache_note = f"; big-block cache: {cache['maps']} maps, {cache['reuses']} reuses"
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
            f"first step includes jit compile; matmul={step.matmul}; {malloc}; per measured step "
            f"(median): {faults:.0f} minor page faults, {sys_s:.2f} s system CPU{cache_note}"
        ),
        extra={"compile_s": first},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
