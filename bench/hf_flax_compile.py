"""The peer, compiled the way ``python -m bertjax.compile`` compiles bertjax: HF's
``FlaxBertForPreTraining`` train step for a TPU slice, with the real TPU compiler, on this host.

    python bench/hf_flax_compile.py --size=large --topology=v5litepod-16 [--length=512]

As HF ships it and its Flax pretraining example trains it: bf16 compute (``dtype``) with fp32
params, gradient checkpointing of every layer, dropout 0.1, MLM logits over the full vocabulary at
every position (``[B, L, V]``; the loss counts the masked positions), NSP, ``optax.adamw``; the
global batch (256) split over every chip, params and optimizer state replicated. Prints the same
figures as the compile tool (per-chip memory, the compiler's FLOPs and HBM bytes, arithmetic
intensity, the roofline bound max(FLOPs / peak, bytes / bandwidth): an estimate from the
compiler's counts, not a timing) as one JSON line, with ``bench/hlo_bytes.py``'s sum over the
HLO and its estimate of the bytes on arrays in HBM (``hlo_bytes_sum``, ``hlo_hbm_bytes``).
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import hlo_bytes  # noqa: E402  (bench/, beside this script)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
import transformers  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from transformers.models.bert import modeling_flax_bert  # noqa: E402

from bertjax.model.config import SIZES  # noqa: E402
from bertjax.training import accelerators, compile_report  # noqa: E402


def hf_config(size: str) -> transformers.BertConfig:
    s = SIZES[size]
    return transformers.BertConfig(
        hidden_size=s["hidden_size"],
        num_hidden_layers=s["num_layers"],
        num_attention_heads=s["num_heads"],
        intermediate_size=s["intermediate_size"],
    )


def train_step(module, tx, state, batch, rng):
    params, opt_state = state

    def loss_fn(params):
        out = module.apply(
            {"params": params},
            batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
            None, None, deterministic=False, rngs={"dropout": rng},
        )  # fmt: skip
        logits = out.prediction_logits.astype(jnp.float32)  # [B, L, V]: every position
        weights = (batch["labels"] >= 0).astype(jnp.float32)
        labels = jnp.maximum(batch["labels"], 0)
        mlm = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        mlm = jnp.sum(mlm * weights) / jnp.maximum(weights.sum(), 1.0)
        nsp = optax.softmax_cross_entropy_with_integer_labels(
            out.seq_relationship_logits.astype(jnp.float32), batch["next_sentence_label"]
        )
        return mlm + nsp.mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="large")
    parser.add_argument("--topology", default="v5litepod-16")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--hlo_out", default=None, help="also write the optimized HLO here")
    args = parser.parse_args()
    tpu = accelerators.slice_for(args.topology)
    devices = topologies.get_topology_desc(
        topology_name=tpu.topology_name, platform="tpu", **tpu.topology_options()
    ).devices
    mesh = Mesh(devices, ("data",))
    module = modeling_flax_bert.FlaxBertForPreTrainingModule(
        hf_config(args.size), dtype=jnp.bfloat16, gradient_checkpointing=True
    )
    ids = jnp.zeros((1, args.length), jnp.int32)
    params = jax.eval_shape(lambda: module.init(jax.random.key(0), ids, ids, ids, None, None))
    params = params["params"]
    tx = optax.adamw(1e-4, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01)
    replicated, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    spec = lambda shape, dtype, sharding: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
    state = jax.tree.map(
        lambda a: spec(a.shape, a.dtype, replicated), (params, jax.eval_shape(tx.init, params))
    )
    batch = {
        k: spec((args.batch, args.length), jnp.int32, rows)
        for k in ("input_ids", "attention_mask", "token_type_ids", "labels")
    }
    batch["next_sentence_label"] = spec((args.batch,), jnp.int32, rows)
    rng = jax.random.key(0)
    step = jax.jit(
        lambda state, batch: train_step(module, tx, state, batch, rng), donate_argnums=(0,)
    )
    started = time.perf_counter()
    with jax.set_mesh(mesh):
        compiled = step.lower(state, batch).compile()
    report = compile_report.compiled_figures(compiled, tpu.chip)
    hlo_text = compiled.as_text()
    counted, hbm = hlo_bytes.breakdown(hlo_text)  # bench/hlo_bytes.py's accounting
    report.update(hlo_bytes_sum=sum(counted.values()), hlo_hbm_bytes=sum(hbm.values()))
    if args.hlo_out:
        with open(args.hlo_out, "w") as f:
            f.write(hlo_text)
    report.update(
        peer="HF FlaxBertForPreTraining", size=args.size, topology=tpu.name, length=args.length,
        batch=args.batch, compile_seconds=round(time.perf_counter() - started, 1),
        hbm_bytes_per_chip=tpu.chip.hbm_bytes,
        fits=report["needed_bytes"] <= tpu.chip.hbm_bytes,
    )  # fmt: skip
    print(json.dumps(report, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
