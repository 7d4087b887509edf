"""Training workdirs: full state saved (and sealed) on one mesh, restored into another's
shardings; the newest step that verifies is the one restored; a workdir holding another model
or vocab is refused before anything is written; export reads the verified step."""

import logging
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.data import bundled
from bertjax.model.encoder import unstack_layers
from bertjax.pretrain import objective as objective_lib
from bertjax.training import checkpoint, checkpoint_manifest, compiled, optimizer, workdir
from bertjax.training import sharding as sh
from tests.pretrain.step_test import tiny_config


def _setup(config, mesh_shape):
    objective = objective_lib.objective_from(config, objective_lib.bert_config_from(config))
    tx = optimizer.create_optimizer(config.optimizer, 10)
    mesh = sh.create_mesh(mesh_shape)
    abstract, shardings = compiled.state_shardings(objective, tx, mesh, config.mesh.rules)
    return objective, tx, abstract, shardings


@pytest.fixture(scope="module")
def initialised():
    """(config, objective, tx, shardings, state): the tiny model's full training state, built
    once on an (8, 1, 1) mesh from key 3 (the tests that save it only read it)."""
    config = tiny_config()
    objective, tx, _, shardings = _setup(config, (8, 1, 1))
    state = compiled.init_state(objective, tx, shardings, jax.random.key(3))
    return config, objective, tx, shardings, state


def _save(path, state, steps, rng):
    checkpoints = workdir.Checkpoints(path, keep=5, async_save=True, log=lambda _: None)
    checkpoints.open_for_writing()
    for step in steps:
        checkpoints.save(step, state.replace(step=jnp.asarray(step, jnp.int32)), rng, {"s": step})
    checkpoints.finish()
    checkpoints.close()


def test_save_on_one_mesh_restore_the_newest_verified_step_on_another(tmp_path, initialised):
    config, _, _, _, state = initialised
    # Make the optimizer state non-trivial so a wrong restore would show.
    state = state.replace(
        opt_state=jax.tree.map(lambda x: x + 0.5 if x.dtype == jnp.float32 else x, state.opt_state)
    )
    rng = np.asarray([1, 2], np.uint32)
    _save(tmp_path, state, (5, 7), rng)
    root = tmp_path / workdir.CHECKPOINTS_DIR
    assert (root / "7" / "bertjax_manifest.json").exists()  # sealed once orbax finalized it
    (root / "9.orbax-checkpoint-tmp-123").mkdir()  # what a run killed during a save leaves
    (root / "8").mkdir()  # an empty step directory
    data = max(
        (p for p in (root / "7" / "state").rglob("*") if p.is_file()),
        key=lambda p: p.stat().st_size,
    )
    data.write_bytes(data.read_bytes()[:-10])  # truncated: step 7 fails verification

    _, _, abstract, other = _setup(config, (2, 2, 2))
    lines = []
    checkpoints = workdir.Checkpoints(tmp_path, keep=5, async_save=True, log=lines.append)
    restored, restored_rng, meta = checkpoints.restore(
        abstract, other, jax.ShapeDtypeStruct((2,), jnp.uint32)
    )
    assert lines[0] == "checkpoint step 8: empty directory (incomplete save); trying step 7"
    assert lines[1].startswith("checkpoint step 7 failed verification: state/")
    assert lines[1].endswith("trying step 5") and "size differs" in lines[1]
    assert meta == {"s": 5} and int(restored.step) == 5
    np.testing.assert_array_equal(restored_rng, rng)
    want = jax.device_get(state.replace(step=jnp.asarray(5, jnp.int32)))
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), want)
    kernel = restored.params["encoder"]["layers"]["layer_0"]["intermediate"]["kernel"]
    assert kernel.sharding == other.params["encoder"]["layers"]["layer_0"]["intermediate"]["kernel"]
    assert kernel.sharding.shard_shape(kernel.shape) == (16, 32)
    checkpoints.open_for_writing()  # accepted: the failed steps move aside
    checkpoints.close()
    assert sorted(p.name.split("-")[0] for p in (tmp_path / workdir.REJECTED_DIR).iterdir()) == [
        "7",
        "8",
    ]


def test_damage_with_nothing_verified_stops_but_incomplete_saves_start_afresh(tmp_path):
    step = tmp_path / workdir.CHECKPOINTS_DIR / "3"
    step.mkdir(parents=True)  # killed before its save was sealed: incomplete
    checkpoints = workdir.Checkpoints(tmp_path, keep=2, async_save=False, log=lambda _: None)
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32)
    assert checkpoints.restore({}, {}, rng) is None and checkpoints.rejected == [3]
    (step / "data").write_bytes(b"x" * 10)
    checkpoint_manifest.write_manifest(step)
    (step / "data").write_bytes(b"y" * 10)  # sealed, then changed: damaged
    checkpoints = workdir.Checkpoints(tmp_path, keep=2, async_save=False, log=lambda _: None)
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint verifies"):
        checkpoints.restore({}, {}, rng)


def test_another_model_or_vocab_is_refused_naming_the_fields(tmp_path):
    bert_config = objective_lib.bert_config_from(tiny_config())
    workdir.write_record(tmp_path, bert_config, bundled.VOCAB, True, "{}")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    other = bert_config.replace(num_layers=3, intermediate_size=48, dtype="bfloat16")
    with pytest.raises(checkpoint.CheckpointError) as error:
        workdir.check_resumable(tmp_path, other, bundled.VOCAB, allow_vocab_change=False)
    assert "config.model.intermediate_size 64 -> 48, config.model.num_layers 2 -> 3" in str(
        error.value
    )
    assert "dtype" not in str(error.value)  # a runtime choice may change between runs
    shuffled = tmp_path.parent / "shuffled.txt"
    lines = open(bundled.VOCAB).read().splitlines()
    shuffled.write_text("\n".join(lines[:5] + lines[6:] + lines[5:6]) + "\n")
    with pytest.raises(checkpoint.CheckpointError, match="same size .* different content"):
        workdir.check_resumable(tmp_path, bert_config, str(shuffled), allow_vocab_change=False)
    workdir.check_resumable(tmp_path, bert_config, str(shuffled), allow_vocab_change=True)
    smaller = tmp_path.parent / "smaller.txt"
    smaller.write_text("\n".join(lines[:1000]) + "\n")
    with pytest.raises(checkpoint.CheckpointError, match="1000 entries but .* has 7633: sizes"):
        workdir.check_resumable(tmp_path, bert_config, str(smaller), allow_vocab_change=False)
    assert before == {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}


def test_latest_params_reads_the_newest_verified_step_or_says_why_it_cannot(tmp_path, initialised):
    """What convert and fine-tuning read from a workdir: the params of its newest step that
    verifies (a damaged newer step named and passed over), unscanned, with the recorded model,
    vocab and casing; each way it cannot is one line."""
    with pytest.raises(checkpoint.CheckpointError, match="not a bertjax training workdir"):
        workdir.latest_params(tmp_path)
    config, _, _, _, state = initialised
    bert_config = objective_lib.bert_config_from(config)
    workdir.write_record(tmp_path, bert_config, bundled.VOCAB, True, "{}")
    with pytest.raises(checkpoint.CheckpointError, match="no complete checkpoint that verifies"):
        workdir.latest_params(tmp_path)
    shifted = lambda step: state.replace(params=jax.tree.map(lambda x: x + step, state.params))
    for step in (5, 7):
        _save(tmp_path, shifted(step), (step,), np.asarray([1, 2], np.uint32))
    step7 = tmp_path / workdir.CHECKPOINTS_DIR / "7"
    data = max((p for p in step7.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data.write_bytes(data.read_bytes()[:-1])
    lines = []
    params, got_config, vocab, lower = workdir.latest_params(tmp_path, log=lines.append)
    assert len(lines) == 1 and lines[0].startswith("checkpoint step 7 failed verification: ")
    want = jax.device_get(shifted(5).params)
    if bert_config.scan_layers:
        want = {**want, "encoder": unstack_layers(want["encoder"], bert_config.num_layers)}
    jax.tree.map(np.testing.assert_array_equal, params, want)
    assert got_config == bert_config and vocab == str(tmp_path / "vocab.txt") and lower is True
    (tmp_path / "bert_config.json").write_text(bert_config.replace(num_layers=3).to_json())
    with pytest.raises(checkpoint.CheckpointError, match="num_layers=3, but .* has 2 encoder"):
        workdir.latest_params(tmp_path, log=lambda _: None)


def test_close_on_the_error_path_seals_the_finalized_saves(tmp_path, monkeypatch, initialised):
    """A run stopping on an error calls close(), not finish(): the save orbax finalized must
    still get its manifest (the error message calls it kept; the next run restores it)."""
    state = initialised[-1]
    sealer_class = checkpoint_manifest.ManifestSealer
    # A sealer that would not look again for a minute (a slow poll or a busy host).
    monkeypatch.setattr(
        checkpoint_manifest,
        "ManifestSealer",
        lambda directory, **kwargs: sealer_class(
            directory, **kwargs, poll_s=60.0, first_poll_s=60.0
        ),
    )
    checkpoints = workdir.Checkpoints(tmp_path, keep=5, async_save=True, log=lambda _: None)
    checkpoints.open_for_writing()
    checkpoints.save(2, state, np.asarray([1, 2], np.uint32), {"s": 2})
    checkpoints.close()  # the error path: no finish()
    root = tmp_path / workdir.CHECKPOINTS_DIR
    assert checkpoint_manifest.latest_verified_step(root, log=lambda _: None) == 2


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def test_a_failed_background_save_is_one_error_and_other_orbax_errors_still_show(
    small_disk, monkeypatch, caplog
):
    """A save that fails in orbax's background threads (a 4 MiB state on a 1 MiB disk, the free
    space check switched off) ends in one CheckpointError naming the directory and the cause;
    none of the lines orbax logs meanwhile (each with a traceback) reach the user. An error of
    another kind that orbax logs still does."""
    checkpoints = workdir.Checkpoints(small_disk / "run", keep=2, async_save=True, log=print)
    monkeypatch.setattr(checkpoints, "_check_space", lambda step, state: None)
    checkpoints.open_for_writing()
    state = {"w": jnp.asarray(np.random.default_rng(0).random((1024, 1024), np.float32))}
    caplog.set_level(logging.INFO)
    with pytest.raises(checkpoint.CheckpointError) as error:
        checkpoints.save(1, state, np.zeros(2, np.uint32), {"step": 1})
        checkpoints.finish()
    assert str(error.value).startswith(f"saving a checkpoint in {small_disk}/run/checkpoints fail")
    assert "No space left on device" in str(error.value) or "RESOURCE_EXHAUSTED" in str(error.value)
    orbax_errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert orbax_errors == [], [r.getMessage()[:120] for r in orbax_errors]
    other = logging.LogRecord(
        "absl", logging.ERROR, "/site-packages/orbax/checkpoint/x.py", 1, "a real error", (), None
    )
    logging.getLogger("absl").handle(other)
    errors = lambda: [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors() == ["a real error"]
    checkpoints.close()
    logging.getLogger("absl").handle(other)  # the filter is gone with the checkpoints
    assert errors() == ["a real error"] * 2
