"""Every package names its public face in `__all__`, and every name there resolves (trio's
test_exports is the model). The direction of imports between packages: test_layers.py."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import pystub_backend

ROOT = Path(pystub_backend.__file__).parent


def _packages() -> list[str]:
    found = []
    for init in sorted(ROOT.rglob("__init__.py")):
        if "_model_path" in init.parts:
            continue
        found.append(".".join(init.parent.relative_to(ROOT.parent).parts))
    return found


def test_the_walk_finds_the_package() -> None:
    assert "pystub_backend.backend.frontends.http" in _packages()


@pytest.mark.parametrize("package", _packages())
def test_every_package_names_its_public_face(package: str) -> None:
    module = importlib.import_module(package)
    names = getattr(module, "__all__", None)
    assert isinstance(names, list | tuple), f"{package} has no __all__"
    assert len(set(names)) == len(names), f"{package}.__all__ repeats a name"
    for name in names:
        assert getattr(module, name, None) is not None or importlib.util.find_spec(f"{package}.{name}"), \
            f"{package}.__all__ names {name!r}, which does not resolve"
