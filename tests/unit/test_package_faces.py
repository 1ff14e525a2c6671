"""The house rules of the package, read from the code itself (trio's test_exports is the model):
every package names its public face in `__all__`, every name there resolves, and imports run one
way: frontends → core → models → scheduling → supervision → ipc, the stub and the backend never
importing each other."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import pystub_backend

ROOT = Path(pystub_backend.__file__).parent
# Lower number = lower layer; a module may import only from its own layer or lower ones.
LAYERS = {"frontends": 5, "core": 4, "models": 3, "scheduling": 2, "supervision": 1}
# Shared vocabulary any layer may use: the request/response types, errors, the log, the config schema.
VOCABULARY = ("pystub_backend.backend.models.config",)


def _packages() -> list[str]:
    found = []
    for init in sorted(ROOT.rglob("__init__.py")):
        if "_model_path" in init.parts:
            continue
        found.append(".".join(init.parent.relative_to(ROOT.parent).parts))
    return found


def _modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if "_model_path" in path.parts:
            continue
        parts = path.with_suffix("").relative_to(ROOT.parent).parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found.append((name, path))
    return found


def _imports(path: Path) -> list[str]:
    """Absolute `pystub_backend` imports that run (those under `if TYPE_CHECKING:` are types only)."""
    tree = ast.parse(path.read_text())
    type_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                 and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
                 for node in ast.walk(block)}
    names = []
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return [name for name in names if name.split(".")[0] == "pystub_backend"]


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] == "backend":
        return LAYERS.get(parts[2])
    return None


def test_the_walk_finds_the_package() -> None:
    assert "pystub_backend.backend.frontends.http" in _packages()
    assert len(_modules()) > 100


@pytest.mark.parametrize("package", _packages())
def test_every_package_names_its_public_face(package: str) -> None:
    module = importlib.import_module(package)
    names = getattr(module, "__all__", None)
    assert isinstance(names, list | tuple), f"{package} has no __all__"
    assert len(set(names)) == len(names), f"{package}.__all__ repeats a name"
    for name in names:
        assert getattr(module, name, None) is not None or importlib.util.find_spec(f"{package}.{name}"), \
            f"{package}.__all__ names {name!r}, which does not resolve"


@pytest.mark.parametrize("module, path", _modules(), ids=[name for name, _ in _modules()])
def test_imports_run_one_way(module: str, path: Path) -> None:
    side = module.split(".")[1] if "." in module else ""
    for target in _imports(path):
        target_side = target.split(".")[1] if "." in target else ""
        if side == "stub":
            assert target_side != "backend", f"{module} (stub) imports {target} (backend)"
        if side == "backend":
            assert target_side != "stub", f"{module} (backend) imports {target} (stub)"
        if side == "ipc":
            assert target_side == "ipc", f"{module} (ipc) imports {target}"
        if side == "devices":  # used by both sides, so it depends on neither
            assert target_side == "devices", f"{module} (devices) imports {target}"
        here, there = _layer(module), _layer(target)
        if here is None or there is None or target.startswith(VOCABULARY):
            continue
        assert there <= here, f"{module} imports {target}, a layer above it"
