"""Peak memory of one offline-builder worker against the work unit's size (issue 36).

    python bench/wikipedia_like_corpus.py --output=/tmp/wiki_like_280mb.txt --documents=80000
    python bench/create_data_memory_bench.py --corpus=/tmp/wiki_like_280mb.txt \
        --unit_mib=16,256 --lengths=128,512 --packing=no,yes [--dupe_factor=10] [--repo=.]

Runs ``python -m bertjax.create_pretraining_data`` with ``--num_workers=1`` (the one worker is
the command's own process: it cuts, tokenizes, pairs, shuffles, masks, packs, writes the pieces
and appends them) for every combination of ``--unit_mib`` (``--work_unit_bytes`` in MiB),
``--lengths`` (``--max_seq_length``; ``--max_predictions_per_seq`` 20 at 128, 80 at 512, and
``round(0.15 L)`` otherwise) and ``--packing``, on the same corpus, 4 output shards, the
original's other flags. Per run: the worker's peak RSS from the kernel (``os.wait4``'s
``ru_maxrss``, the high-water mark, not a sample), its RSS sampled every second at a quarter, half
and three quarters of the run (a plateau shows memory does not grow as the unit is read), wall
time, the units and records written and the output's size. ``--repo`` runs another checkout's
code (e.g. a ``git worktree`` of an older commit) on the same corpus. Prints a markdown table.
"""

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import psutil

REPO = pathlib.Path(__file__).resolve().parents[1]


def _predictions(length: int) -> int:
    return {128: 20, 512: 80}.get(length, round(0.15 * length))


def run_once(corpus: str, out: pathlib.Path, repo: str, flags: list[str]) -> dict:
    sys.path.insert(0, str(REPO))
    from bertjax.data import bundled

    cmd = [
        sys.executable, "-m", "bertjax.create_pretraining_data", f"--input_file={corpus}",
        f"--output_file={out / 'train.tfrecord'}", "--num_output_shards=4",
        f"--vocab_file={bundled.VOCAB}", "--num_workers=1", *flags,
    ]  # fmt: skip
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=repo)
    log = out.with_suffix(".log")
    start = time.perf_counter()
    with open(log, "wb") as sink:
        # cwd=repo: ``python -m`` puts the working directory before PYTHONPATH on sys.path
        child = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=repo)
        process, samples = psutil.Process(child.pid), []
        while True:  # os.wait4, not Popen.poll: the child's own rusage, its ru_maxrss
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            try:
                samples.append((time.perf_counter() - start, process.memory_info().rss))
            except psutil.NoSuchProcess:
                pass
            time.sleep(1.0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped above
    text = log.read_text()
    log.unlink()
    if child.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{text[-2000:]}")
    lines = text.splitlines()
    count = lambda key: next(line.split()[1] for line in lines if line.startswith(key))  # noqa: E731
    at = lambda share: max((rss for t, rss in samples if t <= share * wall), default=0)  # noqa: E731
    return dict(
        wall=wall,
        peak_mb=usage.ru_maxrss / 1024,  # KiB on Linux
        quarters=[at(q) / 2**20 for q in (0.25, 0.5, 0.75)],
        examples=count("examples"),
        rows=count("rows"),
        output_mb=sum(p.stat().st_size for p in out.iterdir()) / 1e6,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True, help="a text file (bench/wikipedia_like_corpus)")
    parser.add_argument("--unit_mib", default="16,256")
    parser.add_argument("--lengths", default="128,512")
    parser.add_argument("--packing", default="no,yes")
    parser.add_argument("--dupe_factor", type=int, default=10)
    parser.add_argument("--repo", default=str(REPO), help="the checkout whose code runs")
    parser.add_argument("--out_dir", default=None, help="for the output (default: a temp dir)")
    args = parser.parse_args()
    megabytes = os.path.getsize(args.corpus) / 2**20
    print(f"corpus {args.corpus}: {megabytes:.1f} MiB; dupe_factor {args.dupe_factor}; "
          f"code {args.repo}; {os.cpu_count()} cores")  # fmt: skip
    print("| unit MiB | L | packed | peak RSS MiB | RSS at 1/4, 1/2, 3/4 of the run MiB | wall s "
          "| examples | rows | output MB |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for length in (int(x) for x in args.lengths.split(",")):
        for packed in args.packing.split(","):
            for unit_mib in (int(x) for x in args.unit_mib.split(",")):
                flags = [
                    f"--work_unit_bytes={unit_mib << 20}", f"--max_seq_length={length}",
                    f"--max_predictions_per_seq={_predictions(length)}",
                    f"--dupe_factor={args.dupe_factor}",
                    *(["--pack_sequences"] if packed == "yes" else []),
                ]  # fmt: skip
                out = pathlib.Path(tempfile.mkdtemp(dir=args.out_dir))
                try:
                    r = run_once(args.corpus, out, args.repo, flags)
                finally:
                    shutil.rmtree(out, ignore_errors=True)
                quarters = ", ".join(f"{q:.0f}" for q in r["quarters"])
                print(f"| {unit_mib} | {length} | {packed} | {r['peak_mb']:.0f} | {quarters} | "
                      f"{r['wall']:.0f} | {r['examples']} | {r['rows']} | {r['output_mb']:.0f} |",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
