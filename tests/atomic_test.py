"""``bertjax.atomic``: what a reader can see of a write that fails, or whose process is killed.

Local disk: real files and a real ``kill -9`` in a child process. Object stores: ``gs://`` mapped
onto a local folder by ``etils.epath.testing.mock_epath`` (objects need no parent directory, as
on GCS), recording every operation that touches the store, to check what is visible when: the
hermetic GCS fixture exercises the same branch against a store's own semantics.
"""

import os
import pathlib
import signal
import subprocess
import sys

import pytest
from etils.epath import gpath, testing

from bertjax import atomic

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _leftovers(directory: pathlib.Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


def test_write_replaces_the_content_with_usual_permissions(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    atomic.write_text(path, "néw\n")
    assert path.read_bytes() == "néw\n".encode()
    atomic.write_bytes(str(path), b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


@pytest.mark.parametrize("mode,data", [("wb", b"half of the new"), ("w", "half of the new")])
def test_an_exception_mid_write_leaves_the_old_content_and_no_temporary(tmp_path, mode, data):
    path = tmp_path / "out"
    path.write_bytes(b"old content")
    with pytest.raises(RuntimeError, match="disk full"), atomic.writer(path, mode) as f:
        f.write(data)
        f.flush()
        raise RuntimeError("disk full")
    assert path.read_bytes() == b"old content"
    with pytest.raises(RuntimeError), atomic.writer(tmp_path / "new", mode) as f:
        raise RuntimeError
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no "new", no temporary


def test_a_killed_writer_leaves_the_old_content(tmp_path):
    """kill -9 in the middle of a streamed write: the reader still sees the whole old file."""
    path = tmp_path / "shard"
    path.write_bytes(b"old" * 1000)
    script = (
        "import os, sys\n"
        "from bertjax import atomic\n"
        "with atomic.writer(sys.argv[1]) as f:\n"
        "    f.write(b'new' * 100000)\n"
        "    f.flush()\n"
        "    print('written', flush=True)\n"
        "    sys.stdin.read()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", script, str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=env)  # fmt: skip
    try:
        assert child.stdout.readline() == b"written\n"
        half = [p for p in tmp_path.iterdir() if p.name.startswith(".shard.tmp-")]
        assert len(half) == 1 and half[0].stat().st_size == 300000  # the new bytes are on disk
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        child.kill()
        child.stdin.close()
        child.stdout.close()
    assert path.read_bytes() == b"old" * 1000
    # What a killed writer leaves is a dot-file next to it, which no reader opens.
    assert _leftovers(tmp_path) == [half[0].name]


def test_directory_replace_swaps_the_whole_directory(tmp_path):
    dst = tmp_path / "model"
    dst.mkdir()
    (dst / "stale.bin").write_text("from the old export")
    (dst / "config.json").write_text("old")
    with atomic.directory(dst, last=("config.json",), replace=True) as stage:
        assert pathlib.Path(stage).parent == tmp_path  # beside dst: one filesystem
        (pathlib.Path(stage) / "config.json").write_text("new")
        (pathlib.Path(stage) / "weights").write_text("w")
        assert (dst / "config.json").read_text() == "old"  # nothing visible before the end
    assert sorted(p.name for p in dst.iterdir()) == ["config.json", "weights"]
    assert _leftovers(tmp_path) == [] and (dst / "config.json").read_text() == "new"
    umask = os.umask(0)
    os.umask(umask)
    assert dst.stat().st_mode & 0o777 == 0o777 & ~umask


def test_directory_failure_changes_nothing(tmp_path):
    dst = tmp_path / "workdir"
    dst.mkdir()
    (dst / "eval_results.json").write_text("old run")
    for replace in (False, True):
        with pytest.raises(OSError), atomic.directory(dst, replace=replace) as stage:
            (pathlib.Path(stage) / "eval_results.json").write_text("new run")
            raise OSError("No space left on device")
        assert sorted(p.name for p in dst.iterdir()) == ["eval_results.json"]
        assert (dst / "eval_results.json").read_text() == "old run"
        assert _leftovers(tmp_path) == []


def test_directory_merge_keeps_other_entries_and_replaces_its_own(tmp_path):
    dst = tmp_path / "workdir"
    (dst / "checkpoint").mkdir(parents=True)
    (dst / "checkpoint" / "old_file").write_text("x")
    (dst / "tensorboard").mkdir()
    with atomic.directory(dst, last=("eval_results.json",)) as stage:
        assert pathlib.Path(stage).parent == dst
        (pathlib.Path(stage) / "checkpoint").mkdir()
        (pathlib.Path(stage) / "checkpoint" / "params").write_text("p")
        (pathlib.Path(stage) / "eval_results.json").write_text("{}")
    assert sorted(p.name for p in dst.iterdir()) == ["checkpoint", "eval_results.json",
                                                     "tensorboard"]  # fmt: skip
    assert sorted(p.name for p in (dst / "checkpoint").iterdir()) == ["params"]


# ---------------------------------------------------------------- object stores (gs://)


@pytest.fixture
def bucket(tmp_path, monkeypatch):
    """``gs://bucket/...`` -> ``tmp_path/bucket/...``; yields the log of store operations."""
    root, log = tmp_path / "store", []
    local = lambda p: str(root / str(p)[len("gs://") :]) if str(p).startswith("gs://") else p

    def logged(name):
        def call(original, path, *args, **kwargs):
            remote = [str(p) for p in (path, *args) if str(p).startswith("gs://")]
            if remote:
                log.append((name, *remote))
            mapped = [local(p) for p in (path, *args)]
            if name in ("copy", "open"):  # writing an object needs no parent "directory"
                written = str(mapped[1] if name == "copy" else mapped[0])
                if written.startswith(str(root)):
                    os.makedirs(os.path.dirname(written), exist_ok=True)
            return original(*mapped, **kwargs)

        return call

    monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)  # TF would take gs:// paths
    names = ("copy", "exists", "isdir", "listdir", "makedirs", "mkdir", "open", "remove", "rename",
             "replace", "rmtree", "stat", "walk", "glob")  # fmt: skip
    with testing.mock_epath(**{name: logged(name) for name in names}):
        yield root, log


def test_object_store_file_is_uploaded_once_complete(bucket):
    root, log = bucket
    with atomic.writer("gs://bucket/run/out.txt", "w") as f:
        f.write("complete")
        assert not (root / "bucket/run/out.txt").exists() and log == []  # nothing visible yet
    assert (root / "bucket/run/out.txt").read_text() == "complete"
    assert [op for op, *_ in log] == ["copy"]  # one upload; no temporary object, no rename
    with pytest.raises(RuntimeError), atomic.writer("gs://bucket/run/out.txt") as f:
        f.write(b"partial")
        raise RuntimeError
    assert (root / "bucket/run/out.txt").read_text() == "complete" and len(log) == 1


def test_object_store_directory_hides_its_marker_until_the_end(bucket):
    root, log = bucket
    (root / "bucket/model").mkdir(parents=True)
    (root / "bucket/model/config.json").write_text("old")
    (root / "bucket/model/stale.bin").write_text("old")
    with atomic.directory("gs://bucket/model", last=("config.json",), replace=True) as stage:
        (pathlib.Path(stage) / "sub").mkdir()
        for name in ("config.json", "model.safetensors", "sub/vocab.txt"):
            (pathlib.Path(stage) / name).write_text("new")
    writes = [(op, path) for op, *paths in log for path in paths if op in ("copy", "remove",
                                                                        "rmtree")]  # fmt: skip
    assert writes == [
        ("remove", "gs://bucket/model/config.json"),  # the old marker goes first
        ("rmtree", "gs://bucket/model"),  # replace: the old prefix
        ("copy", "gs://bucket/model/model.safetensors"),
        ("copy", "gs://bucket/model/sub/vocab.txt"),
        ("copy", "gs://bucket/model/config.json"),  # the marker last
    ]
    assert not any(op in ("rename", "replace") for op, *_ in log)
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert files == ["bucket/model/config.json", "bucket/model/model.safetensors",
                     "bucket/model/sub/vocab.txt"]  # fmt: skip


def test_object_store_merge_replaces_a_directory_entry_whole(bucket):
    """A finished fine-tuning rerun merges its outputs into a gs:// workdir again: none of the
    old checkpoint's objects may stay among the new ones (orbax names its files anew on every
    save, and a stale one fails the checkpoint's verification), as a local merge replaces the
    directory; other entries stay; the marker goes first and comes back last."""
    root, log = bucket
    old = ("checkpoint/params/d/0ld", "checkpoint/bertjax_manifest.json", "tensorboard/events",
           "eval_results.json")  # fmt: skip
    for name in old:
        (root / "bucket/run" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "bucket/run" / name).write_text("old")
    with atomic.directory("gs://bucket/run", last=("eval_results.json",)) as stage:
        for name in ("checkpoint/params/d/n3w", "checkpoint/bertjax_manifest.json",
                     "eval_results.json"):  # fmt: skip
            (pathlib.Path(stage) / name).parent.mkdir(parents=True, exist_ok=True)
            (pathlib.Path(stage) / name).write_text("new")
    files = {str(p.relative_to(root / "bucket/run")): p.read_text()
             for p in root.rglob("*") if p.is_file()}  # fmt: skip
    assert files == {"checkpoint/bertjax_manifest.json": "new", "checkpoint/params/d/n3w": "new",
                     "eval_results.json": "new", "tensorboard/events": "old"}  # fmt: skip
    writes = [(op, path) for op, *paths in log for path in paths if op in ("copy", "remove",
                                                                        "rmtree")]  # fmt: skip
    assert writes[0] == ("remove", "gs://bucket/run/eval_results.json")
    assert writes[-1] == ("copy", "gs://bucket/run/eval_results.json")
    assert ("rmtree", "gs://bucket/run/checkpoint") in writes
