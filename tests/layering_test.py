"""The package's import graph against its stated layering (``bertjax/__init__.py``).

Every ``import`` of a ``bertjax`` module in every file under ``bertjax/`` is read with ``ast``
(imports inside functions too, relative ones, and ``from bertjax import x`` where ``x`` is a
module). No module may import a command module, nor a module of a higher stage; ``pretrain`` and
``finetune`` are peers that never import each other; only commands import ``cli``. The scripts
under ``bench/`` import libraries, never a command. A command parses flags and prints messages:
besides the standard library it imports only absl and ml_collections (flags and configs), so
whatever computes (JAX, NumPy, TensorFlow, orbax, ...) is in a library module.
"""

import ast
import pathlib
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "bertjax"
BENCH = PACKAGE.parent / "bench"
# The commands users type (flags and messages only): no module of the package imports them.
COMMANDS = frozenset({
    "bertjax.main", "bertjax.compile", "bertjax.convert", "bertjax.extract_features",
    "bertjax.tokenize", "bertjax.vocab", "bertjax.create_pretraining_data", "bertjax.data_stats",
    "bertjax.finetune.__main__",
})  # fmt: skip
# Stages, lowest first; a module may import its own stage and lower ones. Stages in one tuple
# are peers. "base" is what every stage may use (the package itself, startup, atomic).
ORDER = (("base",), ("data",), ("model",), ("training",), ("interop",), ("pretrain", "finetune"),
         ("cli", "commands"))  # fmt: skip
STAGE_OF = {
    "bertjax": "base", "bertjax.startup": "base", "bertjax.atomic": "base",
    "bertjax.data": "data", "bertjax.model": "model", "bertjax.training": "training",
    "bertjax.interop": "interop", "bertjax.pretrain": "pretrain", "bertjax.finetune": "finetune",
    "bertjax.cli": "cli",
}  # fmt: skip


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    relative = pathlib.Path(*name.split(".")[1:])
    return (PACKAGE / relative).with_suffix(".py").is_file() or (PACKAGE / relative).is_dir()


def imports(source: str, module: str, is_package: bool = False) -> set[str]:
    """The bertjax modules that ``source`` (the text of ``module``) imports."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "bertjax")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative to the importing module's package
                package = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join([*package, *([base] if base else [])])
            if base.split(".")[0] == "bertjax":
                for alias in node.names:
                    child = f"{base}.{alias.name}"
                    found.add(child if _is_module(child) else base)
    return found


def third_party(source: str) -> set[str]:
    """Top-level names of the non-bertjax, non-standard-library modules ``source`` imports."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add((node.module or "").split(".")[0])
    return found - set(sys.stdlib_module_names) - {"bertjax", "__future__"}


COMMAND_IMPORTS = frozenset({"absl", "ml_collections"})


def stage(module: str) -> str:
    if module in COMMANDS:
        return "commands"
    for prefix in sorted(STAGE_OF, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return STAGE_OF[prefix]
    raise AssertionError(f"{module}: no stage; add it to STAGE_OF in {__file__}")


def level(stage_name: str) -> int:
    return next(i for i, peers in enumerate(ORDER) if stage_name in peers)


def violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, imported in sorted(graph.items()):
        own = stage(module)
        for target in sorted(imported):
            theirs = stage(target)
            if target in COMMANDS:
                found.append(f"{module} imports the command module {target}")
            elif level(theirs) > level(own) or (
                level(theirs) == level(own) and theirs != own and own != "commands"
            ):
                found.append(f"{module} ({own}) imports {target} ({theirs})")
    return found


def package_graph() -> dict[str, set[str]]:
    return {
        module_name(p): imports(p.read_text(), module_name(p), p.name == "__init__.py")
        for p in sorted(PACKAGE.rglob("*.py"))
    }


def test_no_module_imports_a_command_or_a_higher_stage():
    graph = package_graph()
    assert "bertjax.interop.formats" in graph["bertjax.finetune.inputs"]  # the walk sees imports
    assert "bertjax.data.tokenization" in graph["bertjax.finetune.tasks"]  # ... inside functions
    assert violations(graph) == []
    assert sorted(COMMANDS - set(graph)) == []  # every listed command exists


@pytest.mark.parametrize("source,expected", [
    ("from bertjax import convert", "imports the command module bertjax.convert"),
    ("from .. import extract_features", "imports the command module bertjax.extract_features"),
    ("def f():\n    from bertjax.pretrain import loop", "imports bertjax.pretrain.loop (pretrain)"),
    ("import bertjax.cli", "imports bertjax.cli (cli)"),
    ("from bertjax.finetune import inputs", "imports bertjax.finetune.inputs (finetune)"),
])  # fmt: skip
def test_a_bad_import_is_found(source, expected):
    """Each kind of bad import, added to a real module, is reported."""
    module = "bertjax.interop.formats"
    if "pretrain" in source or "cli" in source:
        module = "bertjax.finetune.inputs"
    path = PACKAGE / (module.split(".", 1)[1].replace(".", "/") + ".py")
    graph = package_graph()
    graph[module] = imports(path.read_text() + "\n" + source + "\n", module)
    assert any(expected in v and v.startswith(module) for v in violations(graph)), violations(graph)


def _command_path(module: str) -> pathlib.Path:
    return PACKAGE.parent / (module.replace(".", "/") + ".py")


def test_commands_import_only_flag_libraries():
    """A command holds flags and messages; anything that computes lives in a library module."""
    found = {
        module: sorted(third_party(_command_path(module).read_text()) - COMMAND_IMPORTS)
        for module in sorted(COMMANDS)
    }
    assert {module: names for module, names in found.items() if names} == {}
    assert third_party("import numpy as np\nfrom absl import flags\ndef f():\n import jax") == {
        "numpy",
        "absl",
        "jax",
    }


def test_bench_scripts_import_no_command():
    scripts = sorted(BENCH.glob("*.py"))
    assert len(scripts) > 10  # the walk finds them
    found = []
    for path in scripts:
        module = f"bench.{path.stem}"
        for target in imports(path.read_text(), module):
            if target in COMMANDS:
                found.append(f"{path.relative_to(PACKAGE.parent)} imports the command {target}")
    assert found == []
    assert imports("from bertjax import compile as tool", "bench.x") == {"bertjax.compile"}
