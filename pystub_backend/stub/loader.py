"""Importing a user's `model.py` the way Triton's stub does (docs/reference/model-api.md#files-imports-and-processes).

The version dir, the model dir and the dir holding `triton_python_backend_utils.py` are appended to
`sys.path`, in that order; the file is imported as `<version>.<stem>` (the version dir acts as a
namespace package, so siblings import as `import mylib` or `from . import mylib`) and is also
importable as `model`.

A version's files as they were at load (backend.models.snapshot) come with INIT: a file among
them is imported from those bytes, under its real path, so a restart runs the code of the version
that serves even after the repository changed (or the file is gone). Bytecode caches are not
read for them: a `.pyc` of the newer file would match the file on disk.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import CodeType, ModuleType

__all__ = ["MODEL_PATH_DIR", "LoadError", "load_model_class", "prepare_sys_path", "use_snapshot"]

MODEL_PATH_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_model_path")


class LoadError(Exception):
    """The model file is missing or does not define what the backend needs; text is Triton's."""


def prepare_sys_path(model_path: str) -> None:
    version_dir = os.path.dirname(model_path)
    model_dir = os.path.dirname(version_dir)
    for entry in (version_dir, model_dir, MODEL_PATH_DIR):
        if entry not in sys.path:
            sys.path.append(entry)


def _import(model_path: str) -> ModuleType:
    version_dir = os.path.dirname(model_path)
    stem = os.path.splitext(os.path.basename(model_path))[0]
    module_name = f"{os.path.basename(version_dir)}.{stem}"
    module = importlib.import_module(module_name)
    sys.modules.setdefault("model", module)
    return module


class _SnapshotLoader(importlib.machinery.SourceFileLoader):
    """Imports a file from the bytes kept at load instead of what the path holds now."""

    def __init__(self, fullname: str, path: str, source: bytes) -> None:
        super().__init__(fullname, path)
        self._source = source

    def get_data(self, path: str) -> bytes:
        return self._source if path == self.path else super().get_data(path)

    def get_code(self, fullname: str) -> CodeType:
        return self.source_to_code(self._source, self.path)


class _SnapshotFinder:
    """A `sys.meta_path` finder: where the path finder finds a snapshot file, or nothing because the
    file is gone, the module is loaded from the snapshot's bytes."""

    def __init__(self, sources: dict[str, bytes]) -> None:
        self._sources = sources

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None:  # what the import would find anyway: ours only when it is a snapshot file
            origin = spec.origin if isinstance(spec.loader, importlib.machinery.SourceFileLoader) else None
            return self._spec(fullname, origin, spec.submodule_search_locations) if origin else None
        last = fullname.rpartition(".")[2]
        for entry in path if path is not None else sys.path:
            for candidate in (os.path.join(entry, last, "__init__.py"), os.path.join(entry, f"{last}.py")):
                if os.path.abspath(candidate) in self._sources:
                    package = candidate.endswith("__init__.py")
                    return self._spec(fullname, candidate, [os.path.dirname(candidate)] if package else None)
        return None

    def _spec(self, fullname: str, origin: str, locations: list[str] | None) -> importlib.machinery.ModuleSpec | None:
        source = self._sources.get(os.path.abspath(origin))
        if source is None:
            return None  # the ordinary finders take it
        loader = _SnapshotLoader(fullname, origin, source)
        return importlib.util.spec_from_file_location(fullname, origin, loader=loader,
                                                      submodule_search_locations=locations)


def use_snapshot(sources: dict[str, bytes]) -> None:
    """Import the files in `sources` (absolute path -> bytes) from those bytes from now on."""
    if sources:
        sys.meta_path.insert(0, _SnapshotFinder(sources))


def load_model_class(model_path: str, sources: dict[str, bytes] | None = None) -> type:
    """Import the file (from `sources` when it is there: use_snapshot) and return its
    `TritonPythonModel` class.

    Raises LoadError with Triton's texts for a missing or misnamed file or class; any exception
    the module raises while importing propagates unchanged (its text is what users look for).
    """
    if not model_path.endswith(".py"):
        raise LoadError(f"Model name must end with '.py'. Model name is \"{os.path.basename(model_path)}\".")
    use_snapshot(sources or {})
    if not os.path.isfile(model_path) and os.path.abspath(model_path) not in (sources or {}):
        raise LoadError(f"Python model file not found in '{os.path.abspath(model_path)}'")
    prepare_sys_path(model_path)
    module = _import(model_path)
    model_class = getattr(module, "TritonPythonModel", None)
    if model_class is None:
        raise LoadError(f"Python model '{model_path}' does not define a 'TritonPythonModel' class.")
    return model_class
