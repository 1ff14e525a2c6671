"""The original's small lookup helpers (docs/reference/model-api.md#utility-functions)."""

from __future__ import annotations

from typing import Any

from . import _runtime
from ._binding import binding
from ._errors import TritonModelException

__all__ = [
    "get_input_tensor_by_name",
    "get_output_tensor_by_name",
    "get_input_config_by_name",
    "get_output_config_by_name",
    "using_decoupled_model_transaction_policy",
    "get_model_dir",
]


def get_input_tensor_by_name(inference_request: Any, name: str) -> Any:
    """The request's input `Tensor` called `name`, or None."""
    return _by_name(inference_request.inputs(), name)


def get_output_tensor_by_name(inference_response: Any, name: str) -> Any:
    """The response's output `Tensor` called `name`, or None."""
    return _by_name(inference_response.output_tensors(), name)


def _by_name(tensors: list[Any], name: str) -> Any:
    for tensor in tensors:
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The config's `input` entry called `name`, or None."""
    return _config_entry(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The config's `output` entry called `name`, or None."""
    return _config_entry(model_config, "output", name)


def _config_entry(model_config: dict[str, Any], section: str, name: str) -> dict[str, Any] | None:
    if section in model_config:   # `in` first, as the original: a None config is "not iterable"
        for entry in model_config[section]:
            if entry["name"] == name:
                return entry
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    """`model_config["model_transaction_policy"]["decoupled"]` if that section exists, else False.

    Raises KeyError when the section exists without `decoupled`, as the original does.
    """
    if "model_transaction_policy" in model_config:
        return model_config["model_transaction_policy"]["decoupled"]
    return False


@binding("() -> str", method=False)
def get_model_dir() -> str:
    """The model's version directory. Raises TritonModelException before the stub has set it."""
    path = _runtime.model_dir()
    if path is None:
        raise TritonModelException("The model directory is not known: no model has been loaded in this process.")
    return path
