"""Python-based backends (Triton's name): a backend that is a `model.py` instead of a library.

    config.pbtxt: backend: "<name>"   (not "python")
    <backend-directory>/<name>/model.py   exists  ──▶  every instance runs that file

This is how Triton ships the vLLM backend. What Triton 2.51 does, checked against it:
- the backend's `model.py` is used even when the version directory holds one too; the version
  directory must still exist (it selects the version);
- `initialize(args)` gets the same keys as for a python model: `model_repository` is the
  model's directory, not the backend's; `__file__` is the backend's `model.py`;
- `--backend-config=<name>,key=value` does not reach the model (not in `args`, not in the
  environment): Triton's python backend, which hosts the backend, reads the `python,...`
  settings (shared memory sizes, stub timeouts) for it. pystub does the same: entries for any
  other backend name are accepted and ignored (pystub_backend.backend.supervision.settings).

A model whose backend is neither `python` nor found here keeps pystub's behaviour: it runs the
version directory's model file.
"""

from __future__ import annotations

import os

from pystub_backend.backend.config.model_config import ModelConfig

__all__ = ["BACKEND_MODEL_FILE", "backend_model_file", "model_file_for", "with_backend_runtime"]

BACKEND_MODEL_FILE = "model.py"
_NATIVE = ("", "python")


def backend_model_file(config: ModelConfig, backend_directory: str) -> str | None:
    """`<backend_directory>/<config.backend>/model.py` when the model names a Python-based
    backend that is installed there, else None."""
    backend = config.backend
    if backend in _NATIVE or not backend_directory or os.sep in backend or backend.startswith("."):
        return None  # a backend name is one directory below the backend directory, never a path
    path = os.path.join(backend_directory, backend, BACKEND_MODEL_FILE)
    return os.path.abspath(path) if os.path.isfile(path) else None


def model_file_for(config: ModelConfig, version_model_file: str, backend_directory: str) -> str:
    """The file the model's stubs run: the Python-based backend's `model.py` if there is one,
    else `version_model_file` (the version directory's)."""
    return backend_model_file(config, backend_directory) or version_model_file


def with_backend_runtime(config: ModelConfig, backend_directory: str) -> ModelConfig:
    """`config` with `runtime: "model.py"` when it names an installed Python-based backend and
    sets no runtime, as Triton's `/config` and `args["model_config"]` show it."""
    if config.runtime or backend_model_file(config, backend_directory) is None:
        return config
    completed = ModelConfig()
    completed.CopyFrom(config)
    completed.runtime = BACKEND_MODEL_FILE
    return completed
