"""Validation of the `parameters` a model gives to a BLS request or a response
(docs/reference/model-api.md#parameters)."""

from __future__ import annotations

import json

from ._errors import TritonModelException

__all__ = ["parameters_to_json"]


def parameters_to_json(parameters: object) -> str:
    """`json.dumps` of a dict with `str` keys and `bool`/`int`/`str` values; None gives `"{}"`.

    Raises TritonModelException with the original's texts otherwise. The odd `N8pybind114dictE`
    is the original's: it prints the mangled C++ name of the type it expected.
    """
    if parameters is None or (type(parameters) is dict and not parameters):
        return "{}"  # the common response: no json.dumps (~2 us per response)
    if not isinstance(parameters, dict):
        raise TritonModelException(f"Expect N8pybind114dictE, got {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}"
            )
    return json.dumps(parameters)
