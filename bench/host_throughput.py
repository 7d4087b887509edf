"""The host pipeline's sustainable sequences per second per core, and the host cores a slice needs.

    python bench/host_throughput.py --tfrecord_128=T128 --tfrecord_512=T512 [--reps=3]

``T128`` / ``T512`` are TFRecords from ``python -m bertjax.create_pretraining_data`` on the
bundled corpus at L=128, P=20 and L=512, P=80. Every run is its own subprocess pinned with
``taskset`` to 1 core (``-c 0``) or 2 (``-c 0,1``), with tf.data's private thread pool and
TensorFlow's op thread pools set to the same count. A run builds the pipeline as the trainer does
(``pipeline.create_pretrain_dataset``, ``config.data`` defaults otherwise: dynamic masking for
the text source, whose instance table is cached once under ``--cache_dir`` before any timing;
the TFRecord source reads pre-masked records), takes ``--warmup`` batches untimed (graph tracing,
the first batches, the TFRecord shuffle buffer filling) and then times ``--batches`` batches of
``--batch_size`` sequences. Runs are interleaved over ``--reps`` rounds (every source, length and
core count in each round); the table gives the median and min-max of seq/s, and the load
average (1 min) before each round.

The second table joins the 1-core figure with the compiler's rows in
``bench/results/tpu_compile.jsonl`` (no overrides, i.e. each config as it ships): the sequences
per second a slice needs if a step took the compiler's roofline bound (an estimate, not a
measured step time) = global batch / bound, per host = that / hosts, host cores = per host /
(median seq/s on one core).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
COMPILE_ROWS = os.path.join(ROOT, "bench", "results", "tpu_compile.jsonl")
LENGTHS = {128: 20, 512: 80}  # max_seq_length: max_predictions_per_seq, as the paper
SLICES = ("v5litepod-16", "v4-32")
CONFIGS = ("configs/two_phase.py:base,1", "configs/bert_base.py")
CONFIGS += ("configs/two_phase.py:large,1", "configs/large.py")


def run_child(args):
    """One run: ``--warmup`` untimed batches, then ``--batches`` timed; prints one JSON line."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.cores)
    tf.config.threading.set_inter_op_parallelism_threads(args.cores)
    sys.path.insert(0, ROOT)
    from bertjax.data import pipeline
    from configs import base

    config = base.get_config().data
    config.max_seq_length, config.max_predictions_per_seq = args.length, LENGTHS[args.length]
    config.source = args.source
    if args.source == "tfrecord":
        config.input_files = [args.tfrecord]
    config.cache_dir = args.cache_dir
    dataset = pipeline.create_pretrain_dataset(
        config, batch_size=args.batch_size, seed=0, process_index=0, process_count=1
    )
    options = tf.data.Options()
    options.threading.private_threadpool_size = args.cores
    batches = iter(dataset.with_options(options))
    for _ in range(args.warmup):
        next(batches)
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(args.batches):
        next(batches)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    sequences = args.batches * args.batch_size
    print(json.dumps(dict(seq_per_s=sequences / seconds, seq_per_cpu_s=sequences / cpu)))


def _child(args, source, length, cores):
    cpus = ",".join(str(c) for c in range(cores))
    cmd = ["taskset", "-c", cpus, sys.executable, os.path.abspath(__file__), "--child"]
    cmd += [f"--source={source}", f"--length={length}", f"--cores={cores}"]
    cmd += [f"--tfrecord={getattr(args, f'tfrecord_{length}')}", f"--cache_dir={args.cache_dir}"]
    cmd += [f"--batch_size={args.batch_size}", f"--warmup={args.warmup}"]
    cmd += [f"--batches={args.batches}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _compile_rows():
    """The last row without overrides per (config, topology) in ``tpu_compile.jsonl``."""
    rows = {}
    with open(COMPILE_ROWS) as f:
        for line in f:
            row = json.loads(line)
            if not row["overrides"] and row["topology"] in SLICES:
                rows[row["config"], row["topology"]] = row
    return rows


def _load_config(spec):
    import importlib.util

    path, _, arg = spec.partition(":")
    module_spec = importlib.util.spec_from_file_location("cfg", os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()


def _report(runs, loads):
    print(f"load average (1 min) before each round and at the end: {loads}")
    print("| source | L / P | cores | seq/s (median) | min-max | seq per CPU-s (median) |")
    print("| --- | --- | --- | --- | --- | --- |")
    one_core = {}
    for (source, length, cores), results in runs.items():
        rates = [r["seq_per_s"] for r in results]
        cpu_rates = [r["seq_per_cpu_s"] for r in results]
        if cores == 1:
            one_core[source, length] = statistics.median(rates)
        print(
            f"| {source} | {length} / {LENGTHS[length]} | {cores} | {statistics.median(rates):.0f}"
            f" | {min(rates):.0f}-{max(rates):.0f} | {statistics.median(cpu_rates):.0f} |"
        )
    rows = _compile_rows()
    print(
        "\n| config | slice | L | global batch | bound s/step | slice seq/s | hosts | per host"
        " seq/s | host cores (text) | host cores (TFRecord) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for spec in CONFIGS:
        config = _load_config(spec)
        length, batch = config.data.max_seq_length, config.train.global_batch_size
        for topology in SLICES:
            row = rows.get((spec, topology))
            if row is None:
                print(f"| {spec} | {topology} | no compiler row |")
                continue
            need = batch / row["roofline_seconds"]
            host = need / row["hosts"]
            cores = [host / one_core[s, length] for s in ("text", "tfrecord")]
            print(
                f"| `{spec}` | {topology} | {length} | {batch} | {row['roofline_seconds']:.4f} |"
                f" {need:.0f} | {row['hosts']} | {host:.0f} | {cores[0]:.2f} | {cores[1]:.2f} |"
            )
    print(json.dumps({f"{s},{n},{c}": r for (s, n, c), r in runs.items()}))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tfrecord_128", default="")
    parser.add_argument("--tfrecord_512", default="")
    parser.add_argument("--cache_dir", default="/tmp/bertjax_host_throughput_cache")
    parser.add_argument("--reps", type=int, default=3, help="interleaved rounds of every run")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--batches", type=int, default=500)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--source", default="text")
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--cores", type=int, default=1)
    parser.add_argument("--tfrecord", default="")
    args = parser.parse_args()
    if args.child:
        run_child(args)
        return
    for length in LENGTHS:  # builds (and caches) the text instance tables before any timing
        _child(argparse.Namespace(**{**vars(args), "batches": 1, "warmup": 0}), "text", length, 2)
    keys = [(s, n, c) for s in ("text", "tfrecord") for n in LENGTHS for c in (1, 2)]
    runs, loads = {key: [] for key in keys}, []
    for _ in range(args.reps):
        loads.append(round(os.getloadavg()[0], 2))
        for key in keys:
            runs[key].append(_child(args, *key))
    loads.append(round(os.getloadavg()[0], 2))
    _report(runs, loads)


if __name__ == "__main__":
    main()
