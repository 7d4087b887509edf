"""``python -m bertjax.create_pretraining_data`` on its runners and worker counts, interleaved.

    python bench/create_data_bench.py [--copies=1] [--rounds=2] \
        [--runs=local:1,local:2,DirectRunner:1,DirectRunner:2] [-- TOOL FLAGS]

Runs the tool on the bundled corpus (``--copies`` times over, in one file) with its default
flags (L=128, P=20, dupe_factor=10) plus any extra flags, going through ``--runs`` each round:
``local:N`` is ``--runner=local --num_workers=N``; ``DirectRunner:N`` is Beam's DirectRunner with
N workers (1: in this process; more: ``--direct_running_mode=multi_processing``), kept off Prism's
download (``--prism_location`` at a path that does not exist: its Python runner). Per run: wall
time, CPU utilisation of the whole process tree ((user + sys) / wall / cores), peak of the summed
RSS of the process tree (sampled every 50 ms with psutil), and a digest of the output shards
(every run's must be the same). Prints a markdown table.
"""

import argparse
import gzip
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import psutil


def _tree_rss_and_cpu(process: psutil.Process):
    procs = [process, *process.children(recursive=True)]
    rss = cpu = 0.0
    for p in procs:
        try:
            rss += p.memory_info().rss
            times = p.cpu_times()
            cpu += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return rss, cpu


def _runner_flags(run: str) -> list[str]:
    runner, workers = run.split(":")
    if runner == "local":
        return [f"--num_workers={workers}"]
    beam = ["--prism_location=/nonexistent/prism"]  # no download: Beam's Python runner
    if int(workers) > 1:
        beam += [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
    return [f"--runner={runner}", f"--beam_pipeline_options={' '.join(beam)}"]


def run_tool(corpus: str, out: pathlib.Path, run: str, extra: list[str]) -> dict:
    from bertjax.data import bundled

    cmd = [
        sys.executable,
        "-m",
        "bertjax.create_pretraining_data",
        f"--input_file={corpus}",
        f"--output_file={out / 'train.tfrecord'}",
        "--num_output_shards=4",
        f"--vocab_file={bundled.VOCAB}",
        *_runner_flags(run),
        *extra,
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    start = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    process = psutil.Process(child.pid)
    peak_rss, cpu_seen = 0.0, {}
    while child.poll() is None:
        try:
            for p in [process, *process.children(recursive=True)]:
                t = p.cpu_times()
                cpu_seen[p.pid] = t.user + t.system  # last value seen before it exits
        except psutil.NoSuchProcess:
            pass
        peak_rss = max(peak_rss, _tree_rss_and_cpu(process)[0])
        time.sleep(0.05)
    wall = time.perf_counter() - start
    stdout = child.stdout.read().decode()
    if child.returncode != 0:
        raise SystemExit(f"tool failed ({child.returncode}): {' '.join(cmd)}")
    examples = next(line.split()[1] for line in stdout.splitlines() if line.startswith("examples"))
    digest, output_bytes = hashlib.sha256(), 0
    for shard in sorted(out.iterdir()):
        digest.update(shard.read_bytes())
        output_bytes += shard.stat().st_size
    return dict(
        wall=wall,
        cpu=sum(cpu_seen.values()),
        peak_rss_mb=peak_rss / 2**20,
        examples=int(examples),
        output_mb=output_bytes / 1e6,
        digest=digest.hexdigest()[:12],
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--copies", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", default="local:1,local:2")
    args, extra = parser.parse_known_args()
    extra = [e for e in extra if e != "--"]
    sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
    from bertjax.data import bundled

    cores = os.cpu_count()
    runs = args.runs.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with gzip.open(bundled.TRAIN_CORPUS, "rb") as f:
            text = f.read()
        with open(corpus, "wb") as f:
            for _ in range(args.copies):
                f.write(text + b"\n\n")
        print(
            f"corpus: bundled x{args.copies} ({len(text) * args.copies / 1e6:.1f} MB), extra "
            f"flags {extra}, {cores} cores"
        )
        print(
            "| round | runner:workers | wall s | CPU s | CPU utilisation | peak RSS MB (tree) | "
            "examples | output MB | output sha256 | load avg |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        digests = set()
        for round_ in range(args.rounds):
            for run in runs:
                out = pathlib.Path(tmp) / f"out-{run.replace(':', '-')}"
                shutil.rmtree(out, ignore_errors=True)
                r = run_tool(corpus, out, run, extra)
                digests.add(r["digest"])
                print(
                    f"| {round_ + 1} | {run} | {r['wall']:.1f} | {r['cpu']:.1f} | "
                    f"{100 * r['cpu'] / r['wall'] / cores:.0f}% | {r['peak_rss_mb']:.0f} | "
                    f"{r['examples']} | {r['output_mb']:.0f} | {r['digest']} | "
                    f"{os.getloadavg()[0]:.1f} |",
                    flush=True,
                )
        if len(digests) != 1:
            raise SystemExit(f"the runs wrote different bytes: {sorted(digests)}")


if __name__ == "__main__":
    main()
