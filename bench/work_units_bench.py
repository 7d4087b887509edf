"""How fast a worker cuts a corpus into work units (``bertjax.data.work_units``), per core.

    python bench/work_units_bench.py [--copies=6] [--rounds=3]

The bundled corpus ``--copies`` times over in one plain file and the same text gzip'd; for each,
``spans`` (file sizes) then ``cut_span`` on every span in this one process (what the workers
share between them), the ``.gz`` file with its pieces written to a temporary directory. Prints MB
of text per second, and what reading one unit of the whole text holds (tracemalloc): the lines are
streamed, a few MiB at a time, whatever the unit's size.
"""

import argparse
import gzip
import os
import pathlib
import sys
import tempfile
import time
import tracemalloc


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--copies", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--unit_bytes", type=int, default=1 << 20)
    args = parser.parse_args()
    sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
    from bertjax.data import bundled, work_units

    with gzip.open(bundled.TRAIN_CORPUS, "rb") as f:
        text = f.read()
    with tempfile.TemporaryDirectory() as tmp:
        plain, gz = f"{tmp}/corpus.txt", f"{tmp}/corpus.txt.gz"
        with open(plain, "wb") as f:
            for _ in range(args.copies):
                f.write(text + b"\n\n")
        with open(plain, "rb") as f, gzip.open(gz, "wb", compresslevel=6) as out:
            out.write(f.read())
        megabytes = os.path.getsize(plain) / 1e6
        print(f"{megabytes:.1f} MB of text, unit_bytes {args.unit_bytes}")
        for name, path in (("plain", plain), ("gzip, pieces written", gz)):
            for round_ in range(args.rounds):
                pieces = tempfile.mkdtemp(dir=tmp)
                start = time.perf_counter()
                spans = work_units.spans([path], args.unit_bytes)
                units = work_units.stitch(
                    work_units.cut_span(span, args.unit_bytes, pieces) for span in spans
                )
                seconds = time.perf_counter() - start
                print(
                    f"{name}, round {round_ + 1}: {len(spans)} spans, {len(units)} units, "
                    f"{seconds:.2f} s, {megabytes / seconds:.0f} MB/s"
                )
        (unit,) = work_units.work_units([plain], 10**12)
        tracemalloc.start()
        lines = sum(1 for _ in work_units.unit_lines(unit))  # streamed, as the workers read
        held, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        print(
            f"unit_lines of one {megabytes:.1f} MB unit: {lines} lines, {held / 1e6:.1f} MB "
            f"held after, {peak / 1e6:.1f} MB at the peak"
        )


if __name__ == "__main__":
    main()
