"""Checksum throughput, and the cost of sealing and verifying a BERT-base-sized checkpoint.

    python bench/checkpoint_manifest_bench.py [--dir=/tmp/manifest_bench] [--params=110e6]
        [--rounds=3]

1. zlib.crc32 vs google_crc32c on a 1 GiB random file read in 4 MiB chunks (the loop
   ``bertjax.training.checkpoint_manifest`` runs), page cache warm and, where this process may write
   /proc/sys/vm/drop_caches (root), cold; plus the bare read. Median of ``--rounds``.
2. An orbax CheckpointManager step holding 3 float32 arrays of ``--params`` values (the train
   state: params and Adam's two moments, ~1.3 GB for BERT-base), saved synchronously; then
   ``write_manifest`` and ``verify`` timed, warm and cold. Prints markdown tables.
"""

import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import time
import zlib

import numpy as np


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        pathlib.Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def checksum_file(path: pathlib.Path, kind: str) -> None:
    import google_crc32c

    value = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(4 << 20):
            if kind == "zlib.crc32":
                value = zlib.crc32(chunk, value)
            elif kind == "google_crc32c":
                value = google_crc32c.extend(value, chunk)


def timed(fn, *, cold: bool, rounds: int) -> float | None:
    times = []
    for _ in range(rounds):
        if cold and not drop_caches():
            return None
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def checksum_table(root: pathlib.Path, rounds: int) -> None:
    path = root / "1g.bin"
    with open(path, "wb") as f:
        for _ in range(64):
            f.write(os.urandom(16 << 20))
    gib = path.stat().st_size / 1e9
    print(
        "| loop over 1 GiB, 4 MiB chunks | warm: s (GB/s) | cold: s (GB/s) |\n| --- | --- | --- |"
    )
    for kind in ("read only", "zlib.crc32", "google_crc32c"):
        cells = []
        for cold in (False, True):
            seconds = timed(lambda k=kind: checksum_file(path, k), cold=cold, rounds=rounds)
            cells.append("n/a" if seconds is None else f"{seconds:.2f} ({gib / seconds:.2f})")
        print(f"| {kind} | {cells[0]} | {cells[1]} |")
    path.unlink()


def manifest_table(root: pathlib.Path, params: int, rounds: int) -> None:
    import jax
    import orbax.checkpoint as ocp

    from bertjax.training import checkpoint_manifest as cm

    rng = np.random.default_rng(0)
    state = {
        name: jax.numpy.asarray(rng.standard_normal(params, dtype=np.float32))
        for name in ("params", "mu", "nu")
    }
    manager = ocp.CheckpointManager(
        root / "checkpoints", options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False)
    )
    start = time.perf_counter()
    manager.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
    manager.close()
    save_s = time.perf_counter() - start
    step_dir = root / "checkpoints" / "1"
    total = sum(f.stat().st_size for f in step_dir.rglob("*") if f.is_file())
    count = sum(1 for f in step_dir.rglob("*") if f.is_file())
    print(f"\ncheckpoint: {total / 1e9:.2f} GB in {count} files (orbax save {save_s:.1f} s)\n")
    print("| operation | warm: s (GB/s) | cold: s (GB/s) |\n| --- | --- | --- |")

    def seal():
        cm.write_manifest(step_dir, overwrite=True)

    for threads in (1, 4):
        cm.READ_THREADS = threads
        for name, fn in (("write_manifest", seal), ("verify", lambda: cm.verify(step_dir))):
            cells = []
            for cold in (False, True):
                seconds = timed(fn, cold=cold, rounds=rounds)
                gbps = "" if seconds is None else f" ({total / 1e9 / seconds:.2f})"
                cells.append("n/a" if seconds is None else f"{seconds:.2f}{gbps}")
            what = f"{name} ({cm.default_algorithm()}, {threads} threads)"
            print(f"| {what} | {cells[0]} | {cells[1]} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/manifest_bench")
    parser.add_argument("--params", type=float, default=110e6)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = pathlib.Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    try:
        checksum_table(root, args.rounds)
        manifest_table(root, int(args.params), args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
