"""Importing a user's `model.py` the way Triton's stub does (docs/reference/model-api.md#files-imports-and-processes).

The version dir, the model dir and the dir holding `triton_python_backend_utils.py` are appended to
`sys.path`, in that order; the file is imported as `<version>.<stem>` (the version dir acts as a
namespace package, so siblings import as `import mylib` or `from . import mylib`) and is also
importable as `model`.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

__all__ = ["MODEL_PATH_DIR", "LoadError", "load_model_class", "prepare_sys_path"]

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


def load_model_class(model_path: str) -> type:
    """Import the file and return its `TritonPythonModel` class.

    Raises LoadError with Triton's texts for a missing or misnamed file or class; any exception
    the module raises while importing propagates unchanged (its text is what users look for).
    """
    if not model_path.endswith(".py"):
        raise LoadError(f"Model name must end with '.py'. Model name is \"{os.path.basename(model_path)}\".")
    if not os.path.isfile(model_path):
        raise LoadError(f"Python model file not found in '{os.path.abspath(model_path)}'")
    prepare_sys_path(model_path)
    module = _import(model_path)
    model_class = getattr(module, "TritonPythonModel", None)
    if model_class is None:
        raise LoadError(f"Python model '{model_path}' does not define a 'TritonPythonModel' class.")
    return model_class
