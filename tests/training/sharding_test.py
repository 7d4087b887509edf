"""The sharding contract (``bertjax.training.sharding``'s docstring): the rules are checked
before anything is built, the mesh shape is filled or refused with the numbers, the default rules
split a real model as documented, and no library module names a mesh axis."""

import ast
import pathlib

import jax
import pytest

from bertjax.model import axes
from bertjax.pretrain import objective
from bertjax.training import compiled, optimizer
from bertjax.training import sharding as sh
from tests.pretrain.step_test import tiny_config

PACKAGE = pathlib.Path(__file__).parents[2] / "bertjax"


@pytest.mark.parametrize(
    "rules,message",
    [
        ([("embed",)], "expected (logical_axis, mesh_axes) pairs, got ('embed',)"),
        ([("hidden", "fsdp")], "unknown logical axis 'hidden'"),
        ([("embed", "model")], "'embed' maps to unknown mesh axes ['model']"),
        ([("act_batch", ["data", "pipe"])], "'act_batch' maps to unknown mesh axes ['pipe']"),
    ],
)
def test_bad_rules_are_one_line_naming_the_rule(rules, message):
    with pytest.raises(ValueError, match="^config.mesh.rules: ") as error:
        sh.normalize_rules(rules)
    assert message in str(error.value)


def test_rules_from_a_config_file_become_flax_rules():
    rules = sh.normalize_rules([["act_batch", ["data", "fsdp"]], ["embed", None]])
    assert rules == (("act_batch", ("data", "fsdp")), ("embed", None))
    assert {name for name, _ in sh.DEFAULT_RULES} <= set(axes.PARAM_AXES) | set(
        axes.ACTIVATION_AXES
    )


@pytest.mark.parametrize(
    "shape,devices,expected",
    [((-1, 1, 1), 8, (8, 1, 1)), ((2, -1, 2), 8, (2, 2, 2)), ((1, 1, 1), 1, (1, 1, 1))],
)
def test_one_minus_one_takes_the_remaining_devices(shape, devices, expected):
    assert sh.resolve_mesh_shape(shape, devices) == expected


@pytest.mark.parametrize(
    "shape,devices,message",
    [
        ((-1, -1, 1), 8, "at most one -1"),
        ((3, -1, 1), 8, "8 devices are not divisible by 3"),
        ((2, 2, 1), 8, "needs 4 devices, but 8 are available"),
        ((8, 1), 8, "must have 3 entries"),
    ],
)
def test_a_shape_that_cannot_fit_names_the_numbers(shape, devices, message):
    with pytest.raises(ValueError, match=message):
        sh.resolve_mesh_shape(shape, devices)


def test_default_rules_split_bert_as_documented():
    """On a (2, 2, 2) mesh: embeddings (vocab, embed) over (tensor, fsdp), Q/K/V kernels
    (embed, heads, kv) over (fsdp, tensor, -), the FFN's mlp dimension over tensor, LayerNorms
    over fsdp; Adam's moments take their parameter's sharding; the step counter is replicated."""
    config = tiny_config()
    obj = objective.objective_from(config, objective.bert_config_from(config))
    tx = optimizer.create_optimizer(config.optimizer, 10)
    _, shardings = compiled.state_shardings(obj, tx, sh.create_mesh((2, 2, 2)), sh.DEFAULT_RULES)
    params = shardings.params["encoder"]
    layer = params["layers"]["layer_0"]
    assert tuple(params["embeddings"]["word_embeddings"]["embedding"].spec) == ("tensor", "fsdp")
    assert tuple(layer["attention"]["query"]["kernel"].spec) == ("fsdp", "tensor", None)
    assert tuple(layer["intermediate"]["kernel"].spec) == ("fsdp", "tensor")
    assert tuple(layer["output"]["kernel"].spec) == ("tensor", "fsdp")
    assert tuple(params["embeddings"]["layer_norm"]["scale"].spec) == ("fsdp",)
    moments = jax.tree.leaves(shardings.opt_state, is_leaf=lambda x: hasattr(x, "spec"))
    specs = {tuple(s.spec) for s in moments}
    assert ("tensor", "fsdp") in specs and shardings.step.spec == jax.sharding.PartitionSpec()


def test_no_library_module_names_a_mesh_axis():
    """Mesh axes appear only in sharding.py (and the rules in configs/); commands may name them
    in advice (compile.py). 'fsdp' and 'tensor' anywhere in code, and any string inside a
    PartitionSpec(...) ('data' alone is too common a word: SQuAD's JSON has a "data" key)."""
    commands = {"compile.py"}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in commands and path.parent == PACKAGE:
            continue
        if path.relative_to(PACKAGE).as_posix() == "training/sharding.py":
            continue
        tree = ast.parse(path.read_text())
        in_specs = {
            id(arg)
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "PartitionSpec"
            for arg in ast.walk(node)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and (
                node.value in ("fsdp", "tensor")
                or (id(node) in in_specs and isinstance(node.value, str))
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value!r}")
    assert found == []


@pytest.mark.parametrize(
    "accum,processes,instances,expected",
    [
        # 8 data shards x 2 micro-batches: multiples of 16. 256 / 1.5 = 170.7 rows -> 176;
        # 100 / 1.5 = 66.7 -> 64; 10 / 1.5 = 6.7 -> at least one multiple, 16.
        (2, 1, (256, 100), (176, 64)),
        (2, 1, (10, 10), (16, 16)),
        # 3 processes: multiples of lcm(8, 3) = 24; 256 / 1.5 = 170.7 -> 168 (7 x 24).
        (1, 3, (256, 100), (168, 72)),
    ],
)
def test_packed_batch_sizes_are_the_rows_that_hold_the_instances(
    accum, processes, instances, expected, capsys
):
    """The one resolver of packed batch sizes (main, compile, fine-tuning), counted by hand:
    instances / instances per row, to the nearest multiple of data shards x micro-batches and
    of the processes, at least one; the config itself is left as it was."""
    config = tiny_config()
    config.train.update(grad_accum_steps=accum, global_batch_size=instances[0],
                        eval_batch_size=instances[1])  # fmt: skip
    mesh = sh.create_mesh((4, 2, 1))  # data x fsdp: 8 batch shards
    resolved = sh.packed_batch_sizes(config, mesh, processes, 1.5, unit="examples")
    got = (resolved.train.global_batch_size, resolved.train.eval_batch_size)
    assert got == expected and config.train.global_batch_size == instances[0]
    assert capsys.readouterr().out == (
        f"packing: 1.500 examples per row on average: train.global_batch_size={instances[0]} "
        f"examples -> {expected[0]} rows per step, train.eval_batch_size={instances[1]} -> "
        f"{expected[1]} rows\n"
    )
    quiet = sh.packed_batch_sizes(config, mesh, processes, 1.5, announce=False)
    assert quiet.train.global_batch_size == expected[0] and not capsys.readouterr().out
