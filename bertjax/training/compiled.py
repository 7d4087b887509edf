"""The trainer core on a mesh: abstract state, its shardings, and steps jitted once.

The state is built abstractly (``jax.eval_shape`` of the objective's init and the optimizer's),
its shardings come from the params' logical axes and the config's rules (the optimizer state's
per-parameter leaves take their parameter's), and it is materialised by a jitted init with
``out_shardings``: it never lands whole on one device. Every jitted function is called and
lowered inside ``sharding.tracing_on(mesh, rules)`` (:class:`OnMesh`), so the logical
constraints inside the model resolve against this mesh. Batches are split over the mesh's batch
axes (``sharding.batch_sharding``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bertjax.training import sharding as sh
from bertjax.training.step import Objective, StepConfig, TrainState, eval_sums, train_step


def _abstract_params(objective: Objective):
    """(abstract params, their logical PartitionSpecs), from ``jax.eval_shape`` of the init."""
    boxed = jax.eval_shape(objective.init, jax.random.key(0))
    return nn.unbox(boxed), nn.get_partition_spec(boxed)


def param_shardings(objective: Objective, mesh: Mesh, rules):
    """The params' NamedShardings (ValueError with the numbers when a mesh axis does not divide
    the dimension it splits)."""
    abstract_params, param_specs = _abstract_params(objective)
    shardings = nn.logical_to_mesh_sharding(param_specs, mesh, sh.normalize_rules(rules))
    sh.check_divisible(abstract_params, shardings, mesh)
    return shardings


def state_shardings(objective: Objective, tx, mesh: Mesh, rules):
    """(abstract TrainState, TrainState of NamedShardings) without allocating anything."""
    abstract_params, param_specs = _abstract_params(objective)
    abstract_opt, opt_specs = sh.optimizer_state_specs(tx, abstract_params, param_specs)
    scalar = jax.ShapeDtypeStruct((), jnp.int32)
    abstract = TrainState(scalar, abstract_params, abstract_opt, scalar)
    specs = TrainState(PartitionSpec(), param_specs, opt_specs, PartitionSpec())
    shardings = nn.logical_to_mesh_sharding(specs, mesh, sh.normalize_rules(rules))
    sh.check_divisible(abstract_params, shardings.params, mesh)
    return abstract, shardings


def init_state(objective: Objective, tx, shardings: TrainState, rng, params=None) -> TrainState:
    """Materialises the state straight into ``shardings``, with a fresh optimizer state.

    ``params``: None for fresh params from ``rng``; or host params (a checkpoint's) for some or
    all of the top-level subtrees (``encoder``, heads), the others fresh from ``rng`` exactly as
    a from-scratch run with ``rng`` would draw them (a checkpoint without pretraining heads)."""

    def init(rng, params):
        if params is None or set(params) != set(shardings.params):
            params = {**nn.unbox(objective.init(rng)), **(params or {})}
        zero = jnp.zeros((), jnp.int32)
        return TrainState(zero, params, tx.init(params), zero)

    if params is not None:
        params = {k: jax.tree.map(sh.put_global, v, shardings.params[k]) for k, v in params.items()}
    return jax.jit(init, out_shardings=shardings)(rng, params)


class OnMesh:
    """A jitted function called and lowered inside ``sharding.tracing_on(mesh, rules)``."""

    def __init__(self, jitted, mesh: Mesh, rules):
        self.jitted, self.mesh, self.rules = jitted, mesh, sh.normalize_rules(rules)

    def __call__(self, *args):
        with sh.tracing_on(self.mesh, self.rules):
            return self.jitted(*args)

    def lower(self, *args):
        with sh.tracing_on(self.mesh, self.rules):
            return self.jitted.lower(*args)


def batch_shardings(mesh: Mesh, batch_spec: dict) -> dict:
    return {k: sh.batch_sharding(mesh, len(v.shape)) for k, v in batch_spec.items()}


def jit_train_step(
    objective, tx, schedule, step_config: StepConfig, mesh, rules, shardings, batch_spec
) -> OnMesh:
    """``train_step`` jitted once with in/out shardings and the state donated."""
    replicated = NamedSharding(mesh, PartitionSpec())
    fn = functools.partial(
        train_step, objective=objective, tx=tx, schedule=schedule, step_config=step_config
    )
    jitted = jax.jit(
        fn,
        in_shardings=(shardings, batch_shardings(mesh, batch_spec), replicated),
        out_shardings=(shardings, replicated),
        donate_argnums=(0,),
    )
    return OnMesh(jitted, mesh, rules)


def jit_eval_step(objective, mesh, rules, param_shardings, batch_spec) -> OnMesh:
    """The objective's deterministic sums on a global batch, replicated out."""
    jitted = jax.jit(
        functools.partial(eval_sums, objective=objective),
        in_shardings=(param_shardings, batch_shardings(mesh, batch_spec)),
        out_shardings=NamedSharding(mesh, PartitionSpec()),
    )
    return OnMesh(jitted, mesh, rules)


@dataclasses.dataclass(frozen=True)
class Trainer:
    """Everything a run compiles for an objective on a mesh, built without allocating: the loop
    runs it, ``python -m bertjax.compile`` lowers it for a TPU topology."""

    objective: Any
    tx: Any
    schedule: Any
    mesh: Mesh
    rules: tuple
    abstract_state: TrainState  # of jax.ShapeDtypeStruct
    state_shardings: TrainState  # of NamedSharding
    train_step: OnMesh
    train_batch: dict  # the abstract global train batch (jax.ShapeDtypeStruct)

    def init_state(self, rng, params=None) -> TrainState:
        return init_state(self.objective, self.tx, self.state_shardings, rng, params)

    def jit_eval(self, batch_spec: dict) -> OnMesh:
        return jit_eval_step(
            self.objective, self.mesh, self.rules, self.state_shardings.params, batch_spec
        )


def build_trainer(
    objective, tx, schedule, step_config: StepConfig, mesh: Mesh, rules, train_batch: dict
) -> Trainer:
    """The abstract state with its shardings and the train step jitted for ``train_batch``."""
    rules = sh.normalize_rules(rules)
    abstract, shardings = state_shardings(objective, tx, mesh, rules)
    step = jit_train_step(objective, tx, schedule, step_config, mesh, rules, shardings, train_batch)
    return Trainer(objective, tx, schedule, mesh, rules, abstract, shardings, step, train_batch)
