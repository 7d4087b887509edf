"""Does the host loop run ahead of the device? Two processes of one pretraining run, probed.

    python bench/dispatch_bench.py [--steps=200] [--code=DIR]

Starts processes 0 and 1 of one run as ``python -m bertjax.main --coordinator_address=...``
starts them (``jax.distributed`` on localhost, gloo, one CPU device each, data parallel over
both), on ``configs/tiny.py`` with synthetic data (no input pipeline to wait for), logging every
50 steps, no evaluation or checkpoint during the measured steps. The one change is a probe
around the jitted train step: right before the loop dispatches step s + 1 it asks whether step
s's outputs are ready (``jax.Array.is_ready``, which never blocks).

* A loop that runs ahead dispatches step s + 1 while step s is still running: "in flight".
* A loop that blocks on every step (a per-step ``process_allgather`` of the stop flags, as the
  loop had before, waits for the device to finish step s first) finds step s done.

Reported per process: the share of dispatches with the previous step in flight, over the steps
that follow an ordinary step (not the first, nor one after a log boundary, where the loop fetches
metrics on purpose), and the steps per second over the same steps. ``--code=DIR`` runs another
checkout's ``bertjax`` package (e.g. ``git worktree add /tmp/base <commit>``) with this script's
probe and configs, to compare.
"""

import argparse
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Probe:
    """Wraps the trainer's jitted step; records, per dispatch, whether the last step was still
    running, and when each dispatch happened."""

    def __init__(self, step_fn):
        self.step_fn, self.last, self.in_flight, self.times = step_fn, None, [], []

    def __call__(self, state, batch, rng):
        if self.last is not None:
            self.in_flight.append(not self.last.is_ready())
        self.times.append(time.perf_counter())
        state, metrics = self.step_fn(state, batch, rng)
        self.last = metrics["loss_sum"]  # the step's outputs become ready together
        return state, metrics


def child(args):
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(args.coordinator, 2, args.process_id)
    sys.path.insert(0, os.path.join(REPO, "configs"))
    import tiny

    from bertjax.pretrain import loop as pretrain_loop
    from bertjax.training import loop as loop_lib

    probes = []
    original_init = loop_lib.Loop.__init__

    def init(self, *a, **k):
        original_init(self, *a, **k)
        probes.append(Probe(self.trainer.train_step))
        self.trainer = dataclasses.replace(self.trainer, train_step=probes[-1])

    loop_lib.Loop.__init__ = init
    config = tiny.get_config().unlock()
    config.train.update(dict(synthetic_data=True, num_steps=args.steps, log_every=50, eval_every=0))
    config.checkpoint.every_steps = args.steps  # the only save is the last step's
    pretrain_loop.train_and_evaluate(config, args.workdir)
    probe = probes[0]
    log_every = int(config.train.log_every)
    # in_flight[i] is the dispatch of step i + 2 (1-based), after step i + 1 finished its loop
    # iteration; skip the first and those right after a log boundary (step % log_every == 0).
    kept = [i for i in range(1, len(probe.in_flight)) if (i + 1) % log_every != 0]
    times = [probe.times[i + 1] - probe.times[i] for i in kept]
    result = dict(
        process=args.process_id,
        bertjax=os.path.dirname(pretrain_loop.__file__),
        dispatches=len(kept),
        in_flight=sum(probe.in_flight[i] for i in kept),
        steps_per_second=len(times) / sum(times),
    )
    print("RESULT " + json.dumps(result), flush=True)


def parent(args):
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    env["PYTHONPATH"] = os.pathsep.join([args.code or REPO, env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory() as workdir:
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    f"--child={i}",
                    f"--coordinator=localhost:{port}",
                    f"--workdir={workdir}",
                    f"--steps={args.steps}",
                ],
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for i in range(2)
        ]
        outputs = [p.communicate() for p in procs]
    results = []
    for p, (out, err) in zip(procs, outputs, strict=True):
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        if p.returncode or not lines:
            sys.exit(f"a process failed ({p.returncode}):\n{err[-3000:]}")
        results.append(json.loads(lines[-1][len("RESULT ") :]))
    print(f"bertjax from {results[0]['bertjax']}; load average {os.getloadavg()[0]:.1f}")
    print("| process | dispatches | with the previous step in flight | steps/s |")
    print("| --- | --- | --- | --- |")
    for r in results:
        share = r["in_flight"] / r["dispatches"]
        print(
            f"| {r['process']} | {r['dispatches']} | {r['in_flight']} ({share:.0%}) | "
            f"{r['steps_per_second']:.1f} |"
        )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--code", default="", help="another checkout's root to import from")
    parser.add_argument("--child", type=int, default=None, dest="process_id")
    parser.add_argument("--coordinator", default="")
    parser.add_argument("--workdir", default="")
    args = parser.parse_args()
    if args.process_id is None:
        parent(args)
    else:
        child(args)


if __name__ == "__main__":
    main()
