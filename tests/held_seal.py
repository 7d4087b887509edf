"""Runs a bertjax command with one step's seal held open: the window the kill tests aim at.

    python -m tests.held_seal STEP MARKER bertjax.main --config=... --workdir=...

(from the repository's root). When the run's sealer starts to seal step ``STEP`` (orbax has
committed the step: it is renamed into place, or has ``commit_success.txt`` on GCS), ``MARKER``
is written and the seal waits for ever, so the step never gets its manifest. A test that sees
``MARKER`` and kills the process with SIGKILL lands between orbax's commit of a step and
bertjax's seal of it, where a run with ``keep=1`` once had no step that verified
(``bertjax.training.retention``). ``SIGKILL`` is the only way out of the held seal.
"""

import pathlib
import runpy
import sys
import threading

from bertjax.training import checkpoint_manifest


def _hold(step: int, marker: pathlib.Path) -> None:
    write = checkpoint_manifest.write_manifest

    def held(step_dir, **kwargs):
        if str(step_dir).rstrip("/").rsplit("/", 1)[-1] == str(step):
            marker.write_text(f"{step}\n")
            threading.Event().wait()  # until killed
        return write(step_dir, **kwargs)

    checkpoint_manifest.write_manifest = held


def main(argv: list[str]) -> None:
    step, marker, module, *args = argv
    _hold(int(step), pathlib.Path(marker))
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
