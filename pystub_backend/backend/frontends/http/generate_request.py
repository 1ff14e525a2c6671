"""A generate request's JSON document -> the `InferRequest` it asks for, by Triton 2.51's rules
(docs/reference/protocol.md#generate-extension).

The document's members are read in document order, duplicates kept (a JSON object may repeat a
key; Triton sees each occurrence, so pystub must too):

    "id"            the request id: the first "id" member, a string ("Unable to parse 'id': ...")
    "parameters"    an object whose members are read like top-level members (errors then start
                    "Converting keyword: 'parameters': ")
    <model input>   becomes that input; a second one is "input '<name>' already exists in request"
    anything else   a request parameter: bool, number or string

A member that names an input is checked in Triton's order: a duplicate, then the shape, then
FP16/BF16 (JSON cannot carry them), then each element's JSON type, then the element count. The
shape comes from the model's metadata (batch dimension included): the value's length (1 for a
scalar) must fill it, the last variable dimension takes what the fixed ones leave, the other
variable dimensions are 1 — so `"hi"` for a `[-1, 1]` input is `[1, 1]`, and `["a", "b"]` is
`[2, 1]`. Where Triton answers a client's mistake with 500 (the type errors, an id that is not a
string, a document that is not an object), pystub gives the same text with 400.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.frontends.http.json_body import parse_json_body
from pystub_backend.backend.frontends.http.json_tensors import json_to_tensor_bytes
from pystub_backend.backend.inference import InferRequest, ParameterValue, Tensor

__all__ = ["generate_request"]

_IN_PARAMETERS = "Converting keyword: 'parameters': "
# Triton's words when an element is not of the JSON type its datatype reads (TritonJson's accessors).
_NOT_SIGNED = "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"
_NOT_UNSIGNED = "Unable to parse 'data': attempt to access JSON non-unsigned-integer as unsigned-integer"
_NOT_NUMBER = "Unable to parse 'data': attempt to access JSON non-number as double"
_NOT_BOOLEAN = "Unable to parse 'data': attempt to access JSON non-boolean as boolean"
_NOT_STRING = "Unable to parse JSON bytes array: attempt to access JSON non-string as string"
_WRONG_COUNT = "Unable to parse 'data': Shape does not match true shape of 'data' field"


class _Members:
    """A JSON object as its members in document order, duplicate keys kept."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs


def _load(text: bytes | bytearray) -> object:
    return json.loads(text, object_pairs_hook=_Members)


def _invalid(message: str) -> ServerError:
    return ServerError(message, Status.INVALID_ARG)


def generate_request(body: bytes, metadata: Mapping[str, Any], model_name: str, model_version: str) -> InferRequest:
    """The InferRequest a generate body asks for; `metadata` is the model's (`inputs` with their
    full shapes). Raises ServerError(INVALID_ARG) with Triton's text."""
    document = parse_json_body(body, _load)
    if not isinstance(document, _Members):
        raise _invalid("attempt to get members for non-object")
    builder = _Builder(metadata, _request_id(document))
    for key, value in document.pairs:
        if key == "id":
            continue
        if key == "parameters":
            if not isinstance(value, _Members):
                raise _invalid("Expected JSON object for keyword: 'parameters': attempt to access JSON non-object "
                               "as object")
            for inner_key, inner_value in value.pairs:
                builder.add(inner_key, inner_value, _IN_PARAMETERS)
        else:
            builder.add(key, value, "")
    return InferRequest(model_name, model_version, builder.request_id, builder.tensors, [], builder.parameters)


def _request_id(document: _Members) -> str:
    value = next((value for key, value in document.pairs if key == "id"), "")
    if not isinstance(value, str):
        raise _invalid("Unable to parse 'id': attempt to access JSON non-string as string")
    return value


class _Builder:
    """The inputs and parameters of one request, member by member."""

    def __init__(self, metadata: Mapping[str, Any], request_id: str) -> None:
        self.request_id = request_id
        self.tensors: list[Tensor] = []
        self.parameters: dict[str, ParameterValue] = {}
        self._inputs = {spec["name"]: spec for spec in metadata.get("inputs", [])}

    def add(self, key: str, value: Any, context: str) -> None:  # noqa: ANN401 - a JSON value
        """Member `key` as an input or a parameter; errors start with `context`."""
        try:
            if key in self._inputs:
                self._add_input(self._inputs[key], value)
            else:
                self._add_parameter(key, value)
        except ServerError as error:
            raise _invalid(context + error.message) from None

    def _add_parameter(self, key: str, value: Any) -> None:  # noqa: ANN401 - a JSON value
        if isinstance(value, _Members | list) or value is None:
            raise _invalid(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")
        self.parameters[key] = value

    def _add_input(self, spec: Mapping[str, Any], value: Any) -> None:  # noqa: ANN401 - a JSON value
        name, datatype = spec["name"], spec["datatype"]
        if any(tensor.name == name for tensor in self.tensors):
            request = self.request_id or "<id_unknown>"
            raise _invalid(f"[request id: {request}] input '{name}' already exists in request")
        values = value if isinstance(value, list) else [value]
        shape = _shape(name, [int(dim) for dim in spec["shape"]], len(values))
        if datatype not in ("FP16", "BF16"):  # json_to_tensor_bytes refuses those with Triton's text
            flat = _flat(values)
            _check_types(datatype, flat)
            if len(flat) != math.prod(shape):
                raise _invalid(_WRONG_COUNT)
            values = flat
        self.tensors.append(Tensor(name, datatype, shape, json_to_tensor_bytes(name, datatype, shape, values)))


def _shape(name: str, dims: Sequence[int], count: int) -> tuple[int, ...]:
    """The shape `count` values take in `dims` (variable dimensions: -1), as Triton deduces it."""
    variable = [index for index, dim in enumerate(dims) if dim < 0]
    fixed = math.prod(dim for dim in dims if dim >= 0)
    if not variable and count == fixed:
        return tuple(dims)
    if not variable or fixed == 0 or count % fixed:
        raise _invalid(f"The schema can not convert input '{name}' to tensor with proper shape")
    shape = [1 if dim < 0 else dim for dim in dims]
    shape[variable[-1]] = count // fixed
    return tuple(shape)


def _flat(values: list[Any]) -> list[Any]:
    flat: list[Any] = []
    for value in values:
        if isinstance(value, list):
            flat.extend(_flat(value))
        else:
            flat.append(value)
    return flat


def _check_types(datatype: str, values: list[Any]) -> None:
    """Each element is of the JSON type `datatype` reads, else Triton's error for that type."""
    for datatypes, accepts, message in _TYPE_RULES:
        if datatype in datatypes:
            if not all(map(accepts, values)):
                raise _invalid(message)
            return  # other datatypes: json_to_tensor_bytes names the one it cannot read


# `type(...)`, not isinstance: a bool is an int to Python, not to JSON.
_TYPE_RULES: tuple[tuple[tuple[str, ...], Callable[[Any], bool], str], ...] = (
    (("INT8", "INT16", "INT32", "INT64"), lambda v: type(v) is int and -2**63 <= v < 2**63, _NOT_SIGNED),
    (("UINT8", "UINT16", "UINT32", "UINT64"), lambda v: type(v) is int and 0 <= v < 2**64, _NOT_UNSIGNED),
    (("FP32", "FP64"), lambda v: type(v) in (int, float), _NOT_NUMBER),
    (("BOOL",), lambda v: type(v) is bool, _NOT_BOOLEAN),
    (("BYTES",), lambda v: type(v) is str, _NOT_STRING),
)
