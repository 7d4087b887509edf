"""A fake Python: the venv's on the fake workers and the local one of COMPILE_CHECK=1.

``-c CODE``: the scripts' version check passes, the import check prints a ready line.
``-m bertjax.compile``: records, then exits ``$FAKE_COMPILE_RC`` (one-line error when not 0).
``-m build --sdist --outdir DIR REPO``: records, then writes ``DIR/bertjax-<REPO's
setup.cfg version>.tar.gz`` (empty), as the real build names it.
``-m bertjax.main`` (and any other module): records argv, cwd, whether it leads its own session
(setsid) and PYTHONUNBUFFERED in ``~/python.jsonl``, prints two step lines, sleeps
``$FAKE_TRAIN_SECONDS``.
"""

import json
import os
import sys
import time

args = sys.argv[1:]
if args[0] == "-c":
    if "version_info" not in args[1]:
        print(os.path.basename(os.environ["HOME"]), "python 3.11.9 jax 0.10.2 bertjax ready")
    sys.exit(0)
record = {
    "argv": args,
    "cwd": os.getcwd(),
    "session_leader": os.getsid(0) == os.getpid(),
    "unbuffered": os.environ.get("PYTHONUNBUFFERED"),
}
log = os.environ.get("FAKE_COMPILE_LOG") or os.path.join(os.environ["HOME"], "python.jsonl")
with open(log, "a") as f:
    f.write(json.dumps(record) + "\n")
if args[:2] == ["-m", "build"]:
    outdir, repo = args[args.index("--outdir") + 1], args[-1]
    with open(os.path.join(repo, "setup.cfg")) as f:
        version = next(line.split("=")[1].strip() for line in f if line.startswith("version"))
    open(os.path.join(outdir, f"bertjax-{version}.tar.gz"), "w").close()
    sys.exit(0)
if args[:2] == ["-m", "bertjax.compile"]:
    code = int(os.environ.get("FAKE_COMPILE_RC", "0"))
    if code:
        print("bertjax.compile: error: 1.2 GiB over the 16 GiB HBM of one v4 chip", file=sys.stderr)
    sys.exit(code)
print("step 1: loss 11.0", flush=True)
print("step 2: loss 10.5", flush=True)
time.sleep(float(os.environ.get("FAKE_TRAIN_SECONDS", "0")))
