"""Checkpoint manifests: what they record (against the published CRC check values), what fails
verification and how it is named, the fallback to an older step, the hook into orbax's async
saves with a real CheckpointManager, and a fuzzed manifest reader.
"""

import json
import os
import sys
import zlib

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bertjax.training import checkpoint_manifest as cm

CHECK_INPUT = b"123456789"  # the CRC catalogue's check input: crc32 cbf43926, crc32c e3069283


def _make_step(path, files: dict[str, bytes]):
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    return path


def _sealed(tmp_path, name="7"):
    step = _make_step(
        tmp_path / name,
        {"check.bin": CHECK_INPUT, "state/d/data": bytes(range(256)) * 64, "meta/x": b""},
    )
    cm.write_manifest(step)
    return step


def _reason(step) -> str:
    with pytest.raises(cm.CheckpointCorrupt) as e:
        cm.verify(step)
    assert "\n" not in str(e.value) and str(e.value) == f"{step}: {e.value.reason}"
    return e.value.reason


# ---------------------------------------------------------------- what a manifest records


def test_manifest_records_every_file_with_its_crc32c(tmp_path):
    pytest.importorskip("google_crc32c")
    step = _sealed(tmp_path)
    manifest = json.loads((step / cm.MANIFEST_FILE).read_text())
    assert manifest["format_version"] == 1 and manifest["checksum"] == "crc32c"
    by_path = {f["path"]: f for f in manifest["files"]}
    assert by_path["check.bin"] == {"path": "check.bin", "size": 9, "checksum": "e3069283"}
    assert by_path["meta/x"] == {"path": "meta/x", "size": 0, "checksum": "00000000"}
    assert by_path["state/d/data"]["size"] == 16384
    assert sorted(by_path) == ["check.bin", "meta/x", "state/d/data"]
    assert cm.verify(step) is None


def test_without_google_crc32c_the_manifest_uses_zlib_crc32(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "google_crc32c", None)  # import fails
    step = _sealed(tmp_path)
    manifest = json.loads((step / cm.MANIFEST_FILE).read_text())
    assert manifest["checksum"] == "crc32"
    assert manifest["files"][0] == {"path": "check.bin", "size": 9, "checksum": "cbf43926"}
    data = next(f for f in manifest["files"] if f["path"] == "state/d/data")
    assert data["checksum"] == f"{zlib.crc32(bytes(range(256)) * 64):08x}"
    assert cm.verify(step) is None


def test_a_crc32c_manifest_without_google_crc32c_says_what_to_install(tmp_path, monkeypatch):
    pytest.importorskip("google_crc32c")
    step = _sealed(tmp_path)
    monkeypatch.setitem(sys.modules, "google_crc32c", None)
    with pytest.raises(ValueError, match="pip install google-crc32c$") as e:
        cm.verify(step)
    assert not isinstance(e.value, cm.CheckpointCorrupt)


def test_write_manifest_refuses_temporary_dirs_and_existing_manifests(tmp_path):
    step = _sealed(tmp_path)
    with pytest.raises(ValueError, match="exists already"):
        cm.write_manifest(step)
    tmp = _make_step(tmp_path / "8.orbax-checkpoint-tmp", {"a": b"1"})
    with pytest.raises(ValueError, match="an orbax temporary directory"):
        cm.write_manifest(tmp)


# ---------------------------------------------------------------- what fails, and how it reads


def _reference_checksum(data: bytes) -> str:
    if cm.default_algorithm() == "crc32c":
        import google_crc32c

        return f"{google_crc32c.value(data):08x}"
    return f"{zlib.crc32(data):08x}"


def test_each_kind_of_damage_is_named(tmp_path):
    step = _sealed(tmp_path)
    data = step / "state/d/data"
    original = data.read_bytes()
    flipped = original[:100] + bytes([original[100] ^ 1]) + original[101:]
    data.write_bytes(flipped)
    assert _reason(step) == (
        f"state/d/data: checksum differs: expected {cm.default_algorithm()} "
        f"{_reference_checksum(original)} got {_reference_checksum(flipped)}"
    )
    data.write_bytes(original[:1000])
    assert _reason(step) == "state/d/data: size differs: expected 16384 got 1000"
    data.unlink()
    assert _reason(step) == "state/d/data: missing"
    data.write_bytes(original)
    (step / "state/extra").write_bytes(b"")
    assert _reason(step) == "state/extra: unexpected file (not in the manifest)"
    (step / "state/extra").unlink()
    (step / "state/empty_dir").mkdir()
    assert cm.verify(step) is None  # empty directories hold nothing to restore


def test_no_manifest_and_an_empty_directory_are_incomplete_saves(tmp_path):
    step = _make_step(tmp_path / "3", {"a": b"1"})
    assert _reason(step) == "no manifest (incomplete save)"
    (tmp_path / "4").mkdir()
    with pytest.raises(cm.CheckpointCorrupt) as e:
        cm.verify(tmp_path / "4")
    assert e.value.reason == "empty directory (incomplete save)" and e.value.incomplete


def test_latest_verified_step_walks_back_numerically_with_one_line_each(tmp_path):
    for step in (2, 9, 10):
        _sealed(tmp_path, str(step))
    (tmp_path / "10" / "check.bin").write_bytes(b"123456780")
    (tmp_path / "11").mkdir()
    _make_step(tmp_path / "12.orbax-checkpoint-tmp", {"a": b"1"})  # not a step
    lines = []
    assert cm.latest_verified_step(tmp_path, log=lines.append) == 9
    assert len(lines) == 2
    assert lines[0] == "checkpoint step 11: empty directory (incomplete save); trying step 10"
    assert lines[1].startswith("checkpoint step 10 failed verification: check.bin: checksum ")
    assert lines[1].endswith("; trying step 9")
    for step in (2, 9):
        (tmp_path / str(step) / cm.MANIFEST_FILE).unlink()
    lines.clear()
    assert cm.latest_verified_step(tmp_path, log=lines.append) is None
    assert lines[-1] == "checkpoint step 2: no manifest (incomplete save); none left"
    assert [s for s, _ in cm.step_dirs(tmp_path)] == [11, 10, 9, 2]
    assert cm.latest_verified_step(tmp_path / "absent", log=lines.append) is None
    assert cm.step_dirs(tmp_path / "absent") == []


# ---------------------------------------------------------------- the hook into orbax


def _tree(step: int) -> dict:
    key = jax.random.key(step)
    return {
        "params": jax.random.normal(key, (256, 256), jnp.float32),
        "mu": jnp.full((65536,), float(step), jnp.float32),
        "step": jnp.asarray(step, jnp.int32),
    }


def _manager(path, **async_options):
    return ocp.CheckpointManager(
        path,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=10,
            enable_async_checkpointing=True,
            async_options=ocp.AsyncOptions(**async_options) if async_options else None,
        ),
    )


def _save(manager, step):
    return manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(_tree(step)), meta=ocp.args.JsonSave({"step": step})
        ),
    )


def _largest_file(step_dir) -> str:
    files = [
        os.path.join(directory, name) for directory, _, names in os.walk(step_dir) for name in names
    ]
    return os.path.relpath(max(files, key=os.path.getsize), step_dir)


@pytest.mark.parametrize("damage", ["overwrite-4k", "truncate", "delete-metadata"])
def test_async_saves_are_sealed_verified_and_a_damaged_step_falls_back(tmp_path, damage):
    manager = _manager(tmp_path)
    sealer = cm.ManifestSealer(tmp_path, log=pytest.fail, poll_s=0.05)
    for step in (1, 2, 3):
        assert _save(manager, step)
        sealer.submit(step)
    manager.wait_until_finished()
    sealer.close()
    for step in (1, 2, 3):
        assert (tmp_path / str(step) / cm.MANIFEST_FILE).exists()
        cm.verify(tmp_path / str(step))

    step3 = tmp_path / "3"
    largest = _largest_file(step3)
    size = os.path.getsize(step3 / largest)
    assert size > 3 * 4096, largest
    if damage == "overwrite-4k":
        with open(step3 / largest, "r+b") as f:
            f.seek(size // 2)
            block = f.read(4096)
            f.seek(size // 2)
            f.write(bytes(b ^ 0xFF for b in block))
        assert os.path.getsize(step3 / largest) == size
        expected = f"failed verification: {largest}: checksum differs: expected "
    elif damage == "truncate":
        os.truncate(step3 / largest, size // 2)
        expected = f"failed verification: {largest}: size differs: expected {size} got {size // 2}"
    else:
        os.remove(step3 / "state" / "_METADATA")
        expected = "failed verification: state/_METADATA: missing"
    (tmp_path / "4").mkdir()

    lines = []
    assert cm.latest_verified_step(tmp_path, log=lines.append) == 2
    assert lines[0] == "checkpoint step 4: empty directory (incomplete save); trying step 3"
    assert lines[1].startswith(f"checkpoint step 3 {expected}") and lines[1].endswith(
        "; trying step 2"
    )
    assert len(lines) == 2

    manager.close()
    reader = _manager(tmp_path)
    assert reader.latest_step() == 4  # orbax itself would pick the empty directory
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _tree(2))
    restored = reader.restore(
        2,
        args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
        ),
    )
    assert restored.meta == {"step": 2}
    jax.tree.map(np.testing.assert_array_equal, restored.state, _tree(2))
    reader.close()
    cm.verify(tmp_path / "2")  # restoring wrote nothing into the step


def test_the_sealer_leaves_a_step_that_orbax_never_finalized(tmp_path):
    lines = []
    sealer = cm.ManifestSealer(tmp_path, log=lines.append, poll_s=0.01)
    _make_step(tmp_path / "5.orbax-checkpoint-tmp", {"a": b"1"})  # a save that died
    sealer.submit(5)
    sealer.close()
    assert lines == ["checkpoint step 5: not finalized by orbax; left unsealed"]
    assert not (tmp_path / "5.orbax-checkpoint-tmp" / cm.MANIFEST_FILE).exists()


def test_a_look_that_began_before_the_commit_is_not_the_last_one(tmp_path, monkeypatch):
    """The run's last step: the sealer's look at the step started before orbax finalized it and
    answered "not yet" only after ``close()`` had begun (a slow GCS listing under load). That
    answer predates the commit, so the sealer looks again and seals; the step is not left
    unsealed for the next run to pass over."""
    import threading

    step = tmp_path / "8"
    _make_step(step, {"a": b"1"})
    looking, closing = threading.Event(), threading.Event()
    looks = []

    def finalized(path):
        looks.append(path)
        if len(looks) == 1:  # began before the commit; answers after close() began
            looking.set()
            closing.wait(10)
            return False
        return True

    monkeypatch.setattr(cm.ocp.step, "is_checkpoint_finalized", finalized)
    lines = []
    sealer = cm.ManifestSealer(tmp_path, log=lines.append, poll_s=60)
    sealer.submit(8)
    assert looking.wait(10)
    sealer._closing.set()  # what close() does first, while the look is in flight
    closing.set()
    sealer.close()
    assert lines == [] and len(looks) == 2
    assert cm.verify(step) is None


def test_the_sealer_surfaces_a_failed_seal(tmp_path):
    step = _sealed(tmp_path, "6")  # already has a manifest: sealing it again must fail loudly
    sealer = cm.ManifestSealer(tmp_path, log=pytest.fail)
    sealer.submit(6)
    with pytest.raises(ValueError, match=f"{cm.MANIFEST_FILE}: exists already"):
        sealer.close()
    assert cm.verify(step) is None


# ---------------------------------------------------------------- the reader, fuzzed


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    step = _sealed(tmp_path_factory.mktemp("fuzz"))
    manifest = json.loads((step / cm.MANIFEST_FILE).read_text())
    return step, manifest


def _outcome(step, manifest_bytes: bytes):
    (step / cm.MANIFEST_FILE).write_bytes(manifest_bytes)
    try:
        cm.verify(step)
    except cm.CheckpointCorrupt as e:
        assert "\n" not in str(e)
        return "corrupt"
    return "verified"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=20,
)
FIELD_VALUES = (
    JSON
    | st.sampled_from(
        ["check.bin", "../check.bin", "/check.bin", "meta//x", "meta/x/", "e3069283", "cbf43926"]
    )
    | st.integers(-1, 20000)
)


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(
    document=JSON | st.fixed_dictionaries({"format_version": JSON, "checksum": JSON, "files": JSON})
)
def test_any_json_manifest_verifies_or_is_corrupt(pristine, document):
    step, _ = pristine
    _outcome(step, json.dumps(document).encode())


@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.given(data=st.binary(max_size=200))
def test_any_bytes_as_manifest_are_corrupt(pristine, data):
    step, _ = pristine
    assert _outcome(step, data) == "corrupt"


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(data=st.data())
def test_a_mutated_manifest_verifies_only_if_it_still_describes_the_files(pristine, data):
    step, manifest = pristine
    mutated = json.loads(json.dumps(manifest))
    files = mutated["files"]
    for _ in range(data.draw(st.integers(1, 3))):
        action = data.draw(st.sampled_from(["set", "drop", "duplicate", "shuffle", "top"]))
        if action == "set" and files:
            entry = data.draw(st.sampled_from(files))
            entry[data.draw(st.sampled_from(["path", "size", "checksum", "other"]))] = data.draw(
                FIELD_VALUES
            )
        elif action == "drop" and files:
            files.pop(data.draw(st.integers(0, len(files) - 1)))
        elif action == "duplicate" and files:
            files.append(dict(data.draw(st.sampled_from(files))))
        elif action == "shuffle":
            files[:] = data.draw(st.permutations(files))
        else:
            mutated[data.draw(st.sampled_from(["format_version", "checksum", "x"]))] = data.draw(
                FIELD_VALUES
            )
    outcome = _outcome(step, json.dumps(mutated).encode())
    hypothesis.event(outcome)
    if outcome == "verified":
        truth = {(f["path"], f["size"], f["checksum"]) for f in manifest["files"]}
        assert {(f["path"], f["size"], f["checksum"]) for f in files} == truth
        assert len(files) == len(truth) and mutated["checksum"] == manifest["checksum"]
