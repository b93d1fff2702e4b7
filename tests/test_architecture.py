"""The layers of docs/architecture.md, checked on the import graph of sdbench/ (ast: nothing is imported).

Every `import sdbench.x` / `from sdbench.x import y` anywhere in a module (function-level imports too)
is an edge. The rules: no cycles; measurement knows no operation, command or CLI; operations know no
measurement or command; nothing imports the CLI.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sdbench"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sdbench"):
                targets = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names if alias.name.startswith("sdbench")]
            for target in targets:
                if target in modules and target not in (name, "sdbench"):
                    graph[name].add(target)
                    break
    return graph


GRAPH = _graph()


def test_there_is_no_import_cycle():
    state: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dependency in sorted(GRAPH[module]):
            if state.get(dependency) == 1:
                cycle = path[path.index(dependency):] + [dependency]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dependency not in state:
                visit(dependency, path + [dependency])
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])


def _imports_of(prefix: str) -> set[tuple[str, str]]:
    return {(module, dependency) for module, dependencies in GRAPH.items() if module.startswith(prefix)
            for dependency in dependencies}


@pytest.mark.parametrize("layer, forbidden", [
    ("sdbench.measure", ("sdbench.ops", "sdbench.commands", "sdbench.cli", "sdbench.registry", "sdbench.api")),
    ("sdbench.ops", ("sdbench.measure", "sdbench.commands", "sdbench.cli", "sdbench.api", "sdbench.dispatch")),
    ("sdbench.registry", ("sdbench.measure", "sdbench.commands", "sdbench.cli")),
    ("sdbench.commands", ("sdbench.cli",)),
    ("sdbench.api", ("sdbench.measure", "sdbench.commands", "sdbench.cli")),
])
def test_a_lower_layer_never_imports_a_higher_one(layer, forbidden):
    wrong = sorted((module, dependency) for module, dependency in _imports_of(layer)
                   if dependency.startswith(forbidden))
    assert wrong == []


def test_timing_knows_no_kernel():
    assert not any(dependency.startswith(("sdbench.ops", "sdbench.ext")) for dependency in GRAPH["sdbench.measure.timing"])
