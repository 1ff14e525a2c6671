"""Explicit model control from a model: `load_model`, `unload_model`, `is_model_ready`
(docs/reference/model-api.md#model-control).

Arguments are checked here with the original's texts; the work is done by the stub's model-control
handler, which is installed only when the server runs in explicit model-control mode and only
outside `auto_complete_config` and `finalize`.
"""

from __future__ import annotations

import re

from . import _runtime
from ._binding import BOOL, OBJECT, STR, Arg, binding
from ._errors import TritonModelException, require_str

__all__ = ["load_model", "unload_model", "is_model_ready"]

_UNAVAILABLE = (
    "model control is not available: it requires the server to run with "
    "'--model-control-mode=explicit' and is refused in 'auto_complete_config' and 'finalize'."
)
# What the server's version parser (std::stoll) accepts: optional blanks and sign, then digits.
_VERSION = re.compile(r"\s*[+-]?\d")


@binding("(model_name: str, config: str = '', files: object = None) -> None", Arg("model_name", STR),
         Arg("config", STR, ""), Arg("files", OBJECT, None), method=False)
def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) `model_name`, optionally with a JSON `config` and `{"file:<ver>/<name>": bytes}`.

    Raises TritonModelException `failed to load model '<m>', files should be a dictionary of file
    paths and file contents` and `Failed to load model: <reason>`.
    """
    model_name = require_str("model_name", model_name)
    config = require_str("config", config)
    if files is not None and not _is_file_dict(files):
        raise TritonModelException(
            f"failed to load model '{model_name}', files should be a dictionary of file paths and file contents"
        )
    _call("Failed to load model: ", "load_model", model_name, config, dict(files) if files is not None else None)


@binding("(model_name: str, unload_dependents: bool = False) -> None", Arg("model_name", STR),
         Arg("unload_dependents", BOOL, False), method=False)
def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload `model_name`. Raises TritonModelException `Failed to unload model: <reason>`."""
    model_name = require_str("model_name", model_name)
    _call("Failed to unload model: ", "unload_model", model_name, bool(unload_dependents))


@binding("(model_name: str, model_version: str = '') -> bool", Arg("model_name", STR), Arg("model_version", STR, ""),
         method=False)
def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether `model_name` (at `model_version`, "" meaning any) is ready.

    Raises TritonModelException `failed to get model version from specified version string ...`.
    """
    model_name = require_str("model_name", model_name)
    model_version = require_str("model_version", model_version)
    if model_version and not _VERSION.match(model_version):
        raise TritonModelException(
            f"failed to get model version from specified version string '{model_version}' "
            "(details: stoll), version should be an integral value > 0"
        )
    return bool(_call("", "is_model_ready", model_name, model_version))


def _call(prefix: str, method: str, *args: object) -> object:
    handler = _runtime.model_control()
    if handler is None:
        raise TritonModelException(prefix + _UNAVAILABLE)
    try:
        return getattr(handler, method)(*args)
    except TritonModelException as exc:
        if prefix and not str(exc).startswith(prefix):
            raise TritonModelException(prefix + str(exc)) from None
        raise
    except Exception as exc:  # noqa: BLE001 - every failure surfaces as TritonModelException
        raise TritonModelException(prefix + str(exc)) from None


def _is_file_dict(files: object) -> bool:
    return isinstance(files, dict) and all(
        isinstance(k, str) and isinstance(v, (bytes, bytearray)) for k, v in files.items()
    )
