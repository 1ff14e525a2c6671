"""The layers of the package, read from the code itself: the import graph between packages has no
cycle, and the backend's layers import only downwards (docs/architecture.md draws this order).

The graph is built from the real `import` statements (ast), function-level imports and those under
`if TYPE_CHECKING:` included: a type a module names is a dependency even when it never runs.
`from package import module` is an edge to the module alone (a package's face may name its
children). Two granularities, both acyclic:

    layers    `ipc`, `stub`, each package directly under `backend/` with everything inside it, and
              each module directly in `backend/` (the vocabulary and the start-up)
    packages  every package on its own; a module that sits beside subpackages in their parent
              package is a node of its own (it is not the parent's face)
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

import pystub_backend

ROOT = Path(pystub_backend.__file__).parent
# The backend's layers, highest first: a module may import its own layer or one below it. A layer
# is a package under backend/ or a group of the modules directly in backend/ (in parentheses).
LAYER_ORDER = ("(start-up)", "worker_pool", "frontends", "(settings)", "core", "models", "features", "scheduling",
               "supervision", "telemetry", "config", "(vocabulary)")
MODULE_GROUPS = {
    "(start-up)": ("__main__", "cli", "server", "port_check", "stubctl"),
    "(settings)": ("arguments", "options", "flags", "flag_values", "header_patterns", "completion"),
    "(vocabulary)": ("inference", "errors", "log", "event_loop", "response_stream", "client_link", "delay_hooks"),
}
Graph = dict[str, dict[str, list[str]]]


def _modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if "_model_path" in path.parts:
            continue
        parts = path.with_suffix("").relative_to(ROOT.parent).parts
        found.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), path))
    return found


MODULES = dict(_modules())
PACKAGES = {name for name, path in MODULES.items() if path.name == "__init__.py"}


def _imports(path: Path) -> list[str]:
    """The `pystub_backend` modules `path` imports, for running or for types (`from p import m`
    counts only m when every name it imports is a module)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [f"{node.module}.{alias.name}" for alias in node.names
                       if f"{node.module}.{alias.name}" in MODULES]
            if len(modules) < len(node.names):
                names.append(node.module)
            names.extend(modules)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return [name for name in names if name in MODULES]


def _layer_node(module: str) -> str:
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in ("ipc", "stub", "devices"):
        return parts[1]
    if len(parts) >= 3 and parts[1] == "backend":
        return "backend." + parts[2]
    return module.removeprefix("pystub_backend.") or module


def _package_node(module: str) -> str:
    if module in PACKAGES:
        return module
    parent = module.rpartition(".")[0]
    has_subpackages = any(package.rpartition(".")[0] == parent for package in PACKAGES)
    return module if has_subpackages else parent


def _graph(node: Callable[[str], str]) -> Graph:
    """{node: {node it imports: [the imports that make the edge]}}."""
    graph: Graph = defaultdict(lambda: defaultdict(list))
    for module, path in MODULES.items():
        for target in _imports(path):
            here, there = node(module), node(target)
            if here != there:
                graph[here][there].append(f"{module} imports {target}")
    return graph


def _cycle(graph: Graph) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None (depth-first search, colouring nodes)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, {})):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target, path)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [])):
            return found
    return None


def _explain(graph: Graph, cycle: list[str]) -> str:
    steps = [f"{a} -> {b} ({'; '.join(graph[a][b][:3])})" for a, b in zip(cycle, cycle[1:], strict=False)]
    return "import cycle " + " -> ".join(cycle) + ":\n  " + "\n  ".join(steps)


def test_every_backend_module_has_a_layer() -> None:
    layers = {_layer_node(module) for module in MODULES}
    assert {"ipc", "stub"} <= layers and len(MODULES) > 100
    backend = {layer for layer in layers if layer.startswith("backend.")}
    packages = {f"backend.{name}" for name in LAYER_ORDER if name not in MODULE_GROUPS}
    placed = packages | {f"backend.{module}" for modules in MODULE_GROUPS.values() for module in modules}
    assert backend == placed, "every package and module under backend/ has exactly one place in LAYER_ORDER"


@pytest.mark.parametrize("node", [_layer_node, _package_node], ids=["layers", "packages"])
def test_the_import_graph_has_no_cycle(node: Callable[[str], str]) -> None:
    graph = _graph(node)
    cycle = _cycle(graph)
    assert cycle is None, _explain(graph, cycle or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph: Graph = {"a": {"b": ["a imports b"]}, "b": {"c": ["b imports c"]}, "c": {"a": ["c imports a"]}}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b": []}, "b": {}}) is None


def _rank(node: str) -> int | None:
    """The node's height in LAYER_ORDER (higher imports lower); None outside the backend."""
    name = node.removeprefix("backend.")
    for group, modules in MODULE_GROUPS.items():
        if name in modules:
            name = group
    return len(LAYER_ORDER) - LAYER_ORDER.index(name) if name in LAYER_ORDER else None


def test_the_backend_layers_import_downwards() -> None:
    for here, targets in _graph(_layer_node).items():
        for there, why in targets.items():
            if "stub" in (here, there):  # the stub and the backend share only ipc, devices (and the package root)
                assert {here, there} in ({"stub", "ipc"}, {"stub", "devices"}, {"stub", "pystub_backend"}), why
            if here in ("ipc", "devices"):  # both sides use them, so they depend on neither
                pytest.fail(f"{here} imports only {here}: {why}")
            mine, theirs = _rank(here), _rank(there)
            if mine is not None and theirs is not None:
                assert theirs <= mine, f"{here} imports {there}, a layer above it: {why}"
