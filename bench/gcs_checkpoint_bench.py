"""What sealing and verifying a checkpoint step on gs:// costs: bytes read and time, listing vs
reading, for BERT-base's train state, against the hermetic GCS of tests/gcs (as root).

    python bench/gcs_checkpoint_bench.py [--params=110e6] [--rounds=3] [--dir=/tmp/gcs_bench]

Starts the emulator's namespace (``tests/gcs/emulator.py``), then runs itself inside it: an orbax
CheckpointManager saves 3 float32 arrays of ``--params`` values (params and Adam's two moments,
~1.3 GB for BERT-base; random, so orbax's compression keeps them whole) to
``gs://bench-bucket/run/checkpoints/1``; then ``write_manifest`` and ``verify``
(``bertjax.training.checkpoint_manifest``) run ``--rounds`` times each, as bertjax does on gs://
(from the object listing's crc32c and sizes) and as it does on local disks (reading every object
through TensorFlow's gs:// filesystem). The TLS front's request log gives the bytes served per
operation (object bodies and listing JSON), hence what each one reads. Prints a markdown table.
"""

import argparse
import json
import pathlib
import shutil
import statistics
import sys
import time

REPO = pathlib.Path(__file__).parents[1]
BUCKET = "bench-bucket"


def inside(params: int, rounds: int) -> None:
    """In the namespace: save, then time the seal and the verification both ways."""
    import numpy as np
    import orbax.checkpoint as ocp

    import bertjax  # noqa: F401 - its start-up settings, before TensorFlow meets gs://
    from bertjax.training import checkpoint_manifest as cm

    rng = np.random.default_rng(0)
    state = {k: rng.standard_normal(params, dtype=np.float32) for k in ("params", "mu", "nu")}
    root = f"gs://{BUCKET}/run/checkpoints"
    manager = ocp.CheckpointManager(
        root, options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False)
    )
    events = [("save", time.time())]
    manager.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
    manager.close()
    events.append(("saved", time.time()))
    objects = cm._gcs_listing(f"{root}/1")
    step = [sum(size for size, _ in objects.values()), len(objects)]
    listing = cm._storage_client  # the listing's client; None makes the module read the objects
    for how, client in (("listing", listing), ("reading", lambda: None)):
        cm._storage_client = client
        for round_ in range(rounds):
            seal = lambda: cm.write_manifest(f"{root}/1", overwrite=True)  # noqa: E731
            for name, fn in (("write_manifest", seal), ("verify", lambda: cm.verify(f"{root}/1"))):
                events.append((f"{name} by {how} #{round_}", time.time()))
                fn()
                events.append(("done", time.time()))
    cm._storage_client = listing
    print(json.dumps({"events": events, "step": step}))


def table(events, requests, step_bytes: int, count: int) -> str:
    """Markdown: per operation the median time and the bytes the front served to it."""
    rows: dict[str, list] = {}
    for (name, start), (_, end) in zip(events, events[1:], strict=False):
        if name in ("done", "saved"):
            continue
        served = [r for r in requests if start <= r["t"] < end]
        key = name.split(" #")[0]
        rows.setdefault(key, []).append((end - start, sum(r["out"] for r in served), len(served)))
    lines = [
        f"step: {step_bytes / 1e9:.2f} GB in {count} objects\n",
        "| operation | time (median) | bytes served (object data + listings) | requests |",
        "| --- | --- | --- | --- |",
    ]
    for key, values in rows.items():
        seconds = statistics.median(v[0] for v in values)
        served = statistics.median(v[1] for v in values)
        lines.append(f"| {key} | {seconds:.2f} s | {served / 1e6:,.3f} MB "
                     f"({served / step_bytes:.3%} of the step) | {values[0][2]} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=110e6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/gcs_bench")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        return inside(int(args.params), args.rounds)
    sys.path.insert(0, str(REPO))
    from tests.gcs.emulator import Emulator  # noqa: PLC0415

    root = pathlib.Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    gcs = Emulator.start(root)
    try:
        gcs.create_bucket(BUCKET)
        result = gcs.run([sys.executable, __file__, "--inside", f"--params={args.params}",
                          f"--rounds={args.rounds}"], cwd=REPO, timeout=3600)  # fmt: skip
        if result.returncode:
            raise SystemExit(result.stderr[-3000:])
        out = json.loads(result.stdout.splitlines()[-1])
        events, (step, count) = out["events"], out["step"]
        print(f"orbax save: {events[1][1] - events[0][1]:.1f} s")
        print(table(events[1:], gcs.requests(), step, count))
    finally:
        gcs.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
