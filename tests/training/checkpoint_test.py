"""Training-workdir checkpoints: full state saved on one mesh, restored into another's shardings;
partial (temporary) checkpoint directories are never taken as valid."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.model.heads import BertForPreTraining
from bertjax.pretrain import step as step_lib
from bertjax.training import checkpoint, optimizer
from bertjax.training import sharding as sh
from tests.pretrain.step_test import LENGTH, PREDICTIONS, tiny_config


def _setup(config, mesh_shape):
    model = BertForPreTraining(step_lib.bert_config_from(config))
    tx = optimizer.create_optimizer(config.optimizer, 10)
    mesh = sh.create_mesh(mesh_shape)
    abstract, shardings = step_lib.state_shardings(
        model, tx, mesh, config.mesh.rules, LENGTH, PREDICTIONS
    )
    return model, tx, abstract, shardings


def test_save_on_one_mesh_restore_on_another(tmp_path):
    config = tiny_config()
    model, tx, _, shardings = _setup(config, (8, 1, 1))
    state = step_lib.init_train_state(model, tx, shardings, jax.random.key(3), LENGTH, PREDICTIONS)
    # Make the optimizer state non-trivial so a wrong restore would show.
    state = state.replace(
        step=jnp.asarray(7, jnp.int32),
        opt_state=jax.tree.map(lambda x: x + 0.5 if x.dtype == jnp.float32 else x, state.opt_state),
    )
    rng = np.asarray([1, 2], np.uint32)
    manager = checkpoint.create_manager(tmp_path, every_steps=1, keep=2, async_save=True)
    checkpoint.save_train_state(manager, 7, state, rng, {"step": 7, "data_position": 7})
    manager.wait_until_finished()
    # A temporary directory, as a run killed during a save leaves behind, is not a checkpoint.
    (tmp_path / "checkpoints" / "9.orbax-checkpoint-tmp-123").mkdir()
    manager.close()

    _, _, abstract, other = _setup(config, (2, 2, 2))
    manager = checkpoint.create_manager(tmp_path, every_steps=1, keep=2, async_save=True)
    assert manager.latest_step() == 7
    abstract_rng = jax.ShapeDtypeStruct((2,), jnp.uint32)
    restored, restored_rng, meta = checkpoint.restore_train_state(
        manager, abstract, other, abstract_rng
    )
    manager.close()
    assert meta == {"step": 7, "data_position": 7}
    np.testing.assert_array_equal(restored_rng, rng)
    want = jax.device_get(state)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), want)
    kernel = restored.params["encoder"]["layers"]["layer_0"]["intermediate"]["kernel"]
    assert kernel.sharding == other.params["encoder"]["layers"]["layer_0"]["intermediate"]["kernel"]
    assert kernel.sharding.shard_shape(kernel.shape) == (16, 32)


def test_latest_params_from_workdir_errors_clearly(tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="not a bertjax training workdir"):
        checkpoint.latest_params_from_workdir(tmp_path)
