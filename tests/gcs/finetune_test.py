"""``python -m bertjax.finetune`` with its task data, init checkpoint and workdir on gs://, killed
and resumed, against the same command with every path on local disk.

A tiny MRPC fine-tune (tests/testdata/finetune/mrpc: 16 train pairs, batch 8, 4 epochs: 8 steps,
a checkpoint every 2, dropout on) from ``gcs_hf``, the tiny model as a HF directory:

1. the reference run reads its local copies and writes a local workdir;
2. the same run on gs:// (``init_checkpoint``, ``data_dir`` and ``--workdir``) is killed with
   SIGKILL while step 4's seal is held by the front (orbax has committed step 4; at the shipped
   ``keep=1`` step 2 must still be there: ``bertjax.training.retention``), and rerun: it
   restores step 2 from the gs:// checkpoints and ends with the reference's fine-tuned params,
   bit for bit, its dev metrics, and its prediction files, byte for byte, on gs://, beside
   TensorBoard's events;
3. ``predict`` from that gs:// checkpoint into a new gs:// workdir writes the reference's test
   predictions;
4. a gs:// ``data_dir`` without the task's files is one line naming the gs:// file.

3 and 4 run in one process (``COMMANDS``: the command run as ``__main__`` twice by
``tests.commands.in_process``), a start-up saved.
"""

import dataclasses
import json
import os
import signal
import sys
import time

import pytest

from tests import cpu_xla
from tests.gcs.conftest import COMMANDS, DATA_BUCKET, REPO, download_tree, upload_tree

pytestmark = pytest.mark.xdist_group("gcs")
WORK = "bertjax-finetune"
DATA = REPO / "tests/testdata/finetune/mrpc"

FLAGS = [
    "--config.task.name=mrpc",
    "--config.data.max_seq_length=32",
    "--config.train.global_batch_size=8",
    "--config.train.eval_batch_size=8",
    "--config.optimizer.learning_rate=1e-3",
    "--config.train.num_epochs=4",  # 16 pairs / 8 = 2 updates an epoch: 8 steps
    "--config.train.log_every=2",
    "--config.checkpoint.every_steps=2",  # config.checkpoint.keep as shipped: 1
]

EXISTS = """
import sys
from google.cloud import storage
bucket, name = sys.argv[1][5:].split("/", 1)
print("yes" if storage.Client().bucket(bucket).blob(name).exists() else "", end="")
"""


@dataclasses.dataclass
class Finetune:
    gcs: object
    environ: dict
    init_checkpoint: str  # gs://
    data_dir: str  # gs://

    def command(self, workdir, *extra, local=None) -> list[str]:
        init, data = local or (self.init_checkpoint, self.data_dir)
        return [sys.executable, "-m", "bertjax.finetune", f"--config={REPO}/configs/"
                "finetune_glue.py", f"--workdir={workdir}", f"--config.init_checkpoint={init}",
                f"--config.task.data_dir={data}", *FLAGS, *extra]  # fmt: skip

    def run(self, workdir, *extra, local=None):
        command = self.command(workdir, *extra, local=local)
        return self.gcs.run(command, env=self.environ, cwd=REPO, timeout=300)


@pytest.fixture(scope="module")
def finetune(gcs, gcs_hf, tmp_path_factory):
    gcs.create_bucket(WORK)
    upload_tree(gcs, DATA, f"gs://{DATA_BUCKET}/mrpc")
    root = tmp_path_factory.mktemp("finetune")
    environ = cpu_xla.environ(
        1,
        JAX_COMPILATION_CACHE_DIR=str(root / "jax_cache"),
    )
    return Finetune(gcs, environ, gcs_hf.path, f"gs://{DATA_BUCKET}/mrpc")


@pytest.fixture(scope="module")
def reference(finetune, gcs_hf, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("finetune_reference")
    result = finetune.run(workdir, local=(gcs_hf.local, DATA))
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


def test_a_gs_finetune_killed_mid_seal_resumes_to_the_local_result(gcs, finetune, reference,
                                                                   tmp_path):  # fmt: skip
    workdir = f"gs://{WORK}/run"
    mark = gcs.mark()
    held = [{"match": r"name=run%2Fcheckpoints%2F4%2Fbertjax_manifest.json", "fault": "hold",
             "count": 1}]  # fmt: skip
    with gcs.faults(held):
        proc = gcs.popen(finetune.command(workdir), env=finetune.environ, cwd=REPO,
                         stdout=-1, stderr=-1)  # fmt: skip
        _wait_for_hold(gcs, mark, proc)
    proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -9, err[-3000:]
    assert "eval dev:" not in out  # killed before evaluating
    resumed = finetune.run(workdir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "checkpoint step 4: no manifest (incomplete save); trying step 2" in resumed.stdout
    assert f"restored step 2 from {workdir}/checkpoints" in resumed.stdout
    got = download_tree(gcs, workdir, tmp_path / "run")  # the fine-tuned checkpoint too
    _assert_same_params(got / "checkpoint", reference / "checkpoint")
    dev = lambda path: json.loads((path / "eval_results.json").read_text())["dev"]
    assert dev(got) == dev(reference) and dev(got)["dev"]["num_examples"] == 8
    files = lambda path: {p.name: p.read_bytes() for p in (path / "predictions").iterdir()}
    assert files(got) == files(reference) and "MRPC.tsv" in files(got)
    assert [p for p in (got / "tensorboard").iterdir() if p.name.startswith("events.out.")]


def _assert_same_params(got, want) -> None:
    """The params of two local checkpoints: the same leaves, bit for bit."""
    import jax  # noqa: PLC0415 - JAX and orbax: only when needed
    import numpy as np  # noqa: PLC0415

    from bertjax.training import checkpoint  # noqa: PLC0415

    got, want = (checkpoint.load_params(path)[0] for path in (got, want))
    jax.tree.map(np.testing.assert_array_equal, got, want)


def _wait_for_hold(gcs, mark, proc, timeout=240):
    """Returns once the front holds a request after ``mark``; fails if ``proc`` ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if [r for r in gcs.requests(mark) if r["fault"] == "hold"]:
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before step 4's seal: {proc.communicate()[1]}")
        time.sleep(0.02)
    raise AssertionError(f"step 4's seal was not held within {timeout} s")


@pytest.fixture(scope="module")
def predicted_and_refused(gcs, finetune, reference):
    """Two runs of the command in one process: ``predict`` from the gs:// fine-tuned checkpoint
    into a new gs:// workdir, and a train run on a gs:// ``data_dir`` without the task's files:
    {"predict": ..., "no_data": ...}, each {"code", "stdout", "stderr"}."""
    trained = f"gs://{WORK}/run/checkpoint"
    if not gcs.python(EXISTS, f"{trained}/bertjax_checkpoint.json"):  # without the kill test
        upload_tree(gcs, reference / "checkpoint", trained)
    runs = {
        "predict": finetune.command(
            f"gs://{WORK}/predicted",
            "--config.mode=predict",
            f"--config.task.predict_checkpoint={trained}",
        ),  # fmt: skip
        "no_data": finetune.command(
            f"gs://{WORK}/never", f"--config.task.data_dir=gs://{DATA_BUCKET}/no-mrpc"
        ),
    }
    argvs = [["bertjax.finetune", *command[3:]] for command in runs.values()]
    out = gcs.python(COMMANDS, json.dumps(argvs), env=finetune.environ, cwd=REPO)
    results = [json.loads(line) for line in out.splitlines() if line.startswith('{"code": ')]
    return dict(zip(runs, results, strict=True))


def test_predict_from_a_gs_checkpoint_into_a_gs_workdir(gcs, reference, predicted_and_refused,
                                                        tmp_path):  # fmt: skip
    result = predicted_and_refused["predict"]
    assert result["code"] == 0, result["stderr"][-3000:]
    assert result["stdout"].splitlines()[-1] == "wrote MRPC.tsv"
    got = download_tree(gcs, f"gs://{WORK}/predicted", tmp_path / "predicted")
    assert sorted(os.listdir(got)) == ["predictions"]
    assert (got / "predictions/MRPC.tsv").read_bytes() == (
        reference / "predictions/MRPC.tsv"
    ).read_bytes()


def test_a_gs_data_dir_without_the_task_files_is_one_line_naming_the_file(predicted_and_refused):
    result = predicted_and_refused["no_data"]
    assert result["code"] == 1, result["stderr"][-3000:]
    lines = result["stderr"].strip().splitlines()
    assert lines == [f"finetune: error: gs://{DATA_BUCKET}/no-mrpc/train.tsv: file not found"], (
        lines
    )
