"""A fake ``gcloud`` for tests/launch_test.py: records, validates, and plays a small TPU slice.

Every call appends ``{"argv": [...]}`` as one JSON line to ``$FAKE_GCLOUD_LOG``. The command path
and each flag are checked against the real gcloud's (the reference pages of ``gcloud compute tpus
queued-resources create/describe/delete`` and ``tpu-vm ssh/scp``, and ``gcloud alpha`` for
``--best-effort``, which the GA track lacks): an unknown command or flag, a flag's value missing or
given to a switch, a missing required flag or a wrong number of positionals exits 2 with a
message, as gcloud does. Value flags must use the ``--flag=value`` form (the scripts' style).

Behaviour:
  describe  prints the next state of ``$FAKE_QR_STATES`` (comma-separated; the last one repeats)
  create    fails with exit 1 when ``$FAKE_CREATE_FAIL`` is set
  scp       copies a local file into each selected worker's home (``$FAKE_WORKER_HOMES``,
            os.pathsep-separated, worker 0 first) and records the members of a .tgz
  ssh       runs ``--command`` with bash in each selected worker's home (HOME set to it, PATH
            ``$FAKE_WORKER_PATH``), one worker after the other; exit status: the worst one
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile

VALUE, SWITCH = "value", "switch"
GLOBAL_FLAGS = {"--project": VALUE, "--quiet": SWITCH, "--format": VALUE}
CREATE_FLAGS = {
    "--zone": VALUE,
    "--node-id": VALUE,
    "--accelerator-type": VALUE,
    "--runtime-version": VALUE,
    "--spot": SWITCH,
    "--reserved": SWITCH,
    "--guaranteed": SWITCH,
    "--async": SWITCH,
    "--description": VALUE,
    "--labels": VALUE,
}
CREATE_REQUIRED = {"--zone", "--node-id", "--accelerator-type", "--runtime-version"}
QR = ("compute", "tpus", "queued-resources")
VM = ("compute", "tpus", "tpu-vm")
# path -> (number of positionals, flags, required flags)
COMMANDS = {
    (*QR, "create"): (1, CREATE_FLAGS, CREATE_REQUIRED),
    ("alpha", *QR, "create"): (1, {**CREATE_FLAGS, "--best-effort": SWITCH}, CREATE_REQUIRED),
    (*QR, "describe"): (1, {"--zone": VALUE}, {"--zone"}),
    ("alpha", *QR, "describe"): (1, {"--zone": VALUE}, {"--zone"}),
    (*QR, "delete"): (1, {"--zone": VALUE, "--force": SWITCH, "--async": SWITCH}, {"--zone"}),
    (*VM, "ssh"): (1, {"--zone": VALUE, "--worker": VALUE, "--command": VALUE}, {"--zone"}),
    (*VM, "scp"): (2, {"--zone": VALUE, "--worker": VALUE, "--recurse": SWITCH}, {"--zone"}),
}


def fail(message: str) -> None:
    print(f"ERROR: (gcloud) {message}", file=sys.stderr)
    sys.exit(2)


def parse(argv: list[str]) -> tuple[tuple[str, ...], list[str], dict[str, str | None]]:
    """argv -> (command path, positionals, {flag: value or None for a switch})."""
    path = next((p for p in COMMANDS if tuple(argv[: len(p)]) == p), None)
    if path is None:
        fail(f"unknown command: gcloud {' '.join(w for w in argv if not w.startswith('-'))}")
    num_positionals, command_flags, required = COMMANDS[path]
    allowed = {**GLOBAL_FLAGS, **command_flags}
    positionals, flags = [], {}
    for word in argv[len(path) :]:
        if not word.startswith("-"):
            positionals.append(word)
            continue
        name, has_value, value = word.partition("=")
        if name not in allowed:
            fail(f"unrecognized arguments: {name} (gcloud {' '.join(path)})")
        if allowed[name] == VALUE and not (has_value and value):
            fail(f"argument {name}: expected one argument, as {name}=VALUE")
        if allowed[name] == SWITCH and has_value:
            fail(f"argument {name}: ignored explicit argument '{value}'")
        flags[name] = value if has_value else None
    if len(positionals) != num_positionals:
        fail(f"gcloud {' '.join(path)} takes {num_positionals} positionals, got {positionals}")
    if missing := sorted(required - flags.keys()):
        fail(f"argument {', '.join(missing)}: Must be specified.")
    return path, positionals, flags


def workers(flags: dict) -> list[pathlib.Path]:
    homes = [pathlib.Path(h) for h in os.environ.get("FAKE_WORKER_HOMES", "").split(os.pathsep)]
    homes = [h for h in homes if str(h) not in ("", ".")]
    selected = flags.get("--worker") or "0"
    if selected == "all":
        return homes
    if homes and int(selected) >= len(homes):
        fail(f"worker {selected} is out of range: the node has {len(homes)} workers")
    return homes[int(selected) : int(selected) + 1]


def next_state(log: pathlib.Path) -> str:
    states = os.environ.get("FAKE_QR_STATES", "ACTIVE").split(",")
    counter = log.with_suffix(".describes")
    count = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(count + 1))
    return states[min(count, len(states) - 1)]


def main() -> None:
    argv = sys.argv[1:]
    log = pathlib.Path(os.environ["FAKE_GCLOUD_LOG"])
    record = {"argv": argv}
    path, positionals, flags = parse(argv)
    verb = path[-1]
    if verb == "scp":
        source, destination = positionals
        if source.endswith(".tgz"):
            with tarfile.open(source) as tar:
                record["tar_members"] = tar.getnames()
        _, _, remote = destination.partition(":")
        for home in workers(flags):
            shutil.copy(source, home / remote)
    with log.open("a") as f:
        f.write(json.dumps(record) + "\n")
    if verb == "describe":
        if flags.get("--format") != "value(state.state)":
            fail("the scripts read the state with --format=value(state.state)")
        print(next_state(log))
    elif verb == "create" and os.environ.get("FAKE_CREATE_FAIL"):
        print("ERROR: (gcloud.compute.tpus.queued-resources.create) no quota", file=sys.stderr)
        sys.exit(1)
    elif verb == "ssh":
        env = {"PATH": os.environ["FAKE_WORKER_PATH"]}
        env.update({k: v for k, v in os.environ.items() if k.startswith("FAKE_TRAIN")})
        command = ["bash", "-c", flags["--command"]]
        runs = [subprocess.run(command, cwd=h, env={**env, "HOME": str(h)}) for h in workers(flags)]
        sys.exit(max((run.returncode for run in runs), default=0))


if __name__ == "__main__":
    main()
