"""HTTP inference bodies: requests decoded into an `InferRequest`, an `InferResponse` encoded
(docs/reference/protocol.md#http-inference-and-binary-tensors).

Pure functions, no aiohttp. A request body is a JSON header optionally followed by raw tensors:

    +-------------------------------------+----------------+----------------+-----
    | JSON header (Inference-Header-      | input A bytes  | input B bytes  | ...
    |   Content-Length bytes, or all)     | (binary_data_  | (binary_data_  |
    |                                     |  size of A)    |  size of B)    |
    +-------------------------------------+----------------+----------------+-----

Responses use the same layout with the binary outputs (`encode_infer_response`); a header length of
0 means a raw request (raw.py).

Binary inputs stay memoryviews of the request body. The HTTP-only parameters (`binary_data_output`,
`binary_data`, `binary_data_size`) are removed from what reaches the core and kept in the
`OutputFormat` the encoder needs.

A response body is the JSON header followed by the binary outputs in header order; headers say which:
`application/json`, or `application/octet-stream` plus `Inference-Header-Content-Length` as soon as
one output is binary (even an empty one). Outputs written to client shared memory are listed as
`{name, datatype, shape}` only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.frontends.http.json_body import JSON_PARSE_ERROR, MAX_JSON_DEPTH, parse_json_body
from pystub_backend.backend.frontends.http.json_tensors import (
    dump_header,
    json_to_tensor_bytes,
    load_document,
    tensor_json_value,
)
from pystub_backend.backend.inference import InferRequest, InferResponse, ParameterValue, RequestedOutput, Tensor
from pystub_backend.ipc.dtypes import WIRE_TO_CODE

__all__ = [
    "INFERENCE_HEADER",
    "SHM_REGION",
    "Body",
    "DecodedRequest",
    "EncodedResponse",
    "OutputFormat",
    "decode_http_body",
    "decode_infer_request",
    "encode_infer_response",
    "parse_header_length",
]

INFERENCE_HEADER = "Inference-Header-Content-Length"
SHM_REGION = "shared_memory_region"
Body = bytes | bytearray | memoryview

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1  # dims are int64, as in Triton and on the wire to the stub
_INT32_DIGITS = re.compile(r"[0-9]{1,10}")  # bounded, so int() never sees a huge string
_PARAMETER_TYPES = (bool, int, float, str)


def _invalid(message: str) -> ServerError:
    return ServerError(message, Status.INVALID_ARG)


@dataclass
class OutputFormat:
    """How the response must be written: what the request asked for on the HTTP side."""

    binary_default: bool = False  # request-level `binary_data_output`
    binary: dict[str, bool] = field(default_factory=dict)  # per-output `binary_data`
    shared_memory: set[str] = field(default_factory=set)  # outputs the core writes to client shm
    requested: set[str] | None = None  # None: every output
    request_id: str | None = None  # the request's `id`, None when it carried none
    force_binary: bool = False  # raw requests get every output as binary

    def is_binary(self, name: str) -> bool:
        if self.force_binary:
            return True
        return self.binary.get(name, self.binary_default)


@dataclass
class DecodedRequest:
    request: InferRequest
    output_format: OutputFormat


def parse_header_length(value: str | None, body_size: int) -> int | None:
    """`Inference-Header-Content-Length` as an int in [0, body_size], or None when absent.

    Raises ServerError(INVALID_ARG) when it is not a non-negative int32 within the body.
    """
    if value is None:
        return None
    text = value.strip()
    if not _INT32_DIGITS.fullmatch(text) or int(text) > _INT32_MAX:
        raise _invalid(f"invalid {INFERENCE_HEADER} header value '{value}': expected an int32")
    length = int(text)
    if length > body_size:
        raise _invalid(f"inference header size should be in range (0, {body_size}), got: {length}")
    return length


def decode_http_body(body: Body, header_value: str | None, model_name: str, model_version: str = ""
                     ) -> DecodedRequest | None:
    """An inference body as its `Inference-Header-Content-Length` header (`header_value`, None when
    absent) frames it; None for a raw body (a header length of 0: http_raw decodes it). Raises
    ServerError(INVALID_ARG) as `parse_header_length` and `decode_infer_request` do."""
    length = parse_header_length(header_value, len(body)) if header_value is not None else None
    if length == 0:
        return None
    return decode_infer_request(body, length, model_name, model_version)


def decode_infer_request(
    body: Body, header_length: int | None, model_name: str, model_version: str = ""
) -> DecodedRequest:
    """Decode a JSON (+ binary) inference body. `header_length` None means all JSON.

    Raises ServerError(INVALID_ARG) for malformed JSON, wrong types, or binary framing errors.
    """
    view = memoryview(body).cast("B")
    header_end = len(view) if header_length is None else header_length
    text = _json_text(body, view, header_end)
    if text.count(b"[") + text.count(b"{") <= MAX_JSON_DEPTH:  # json_body's cheap bound: cannot be too deep
        try:
            document = load_document(text)
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            raise _invalid(f"{JSON_PARSE_ERROR}: {exc}") from None
    else:
        document = parse_json_body(text, load_document)  # the full depth check
    if not isinstance(document, dict):
        raise _invalid("the inference request must be a JSON object")
    request_id = document.get("id", "")
    if not isinstance(request_id, str):
        raise _invalid("'id' of the inference request must be a string")
    parameters = _parameters(document.get("parameters"), "the inference request")
    binary_default = parameters.pop("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise _invalid("parameter 'binary_data_output' must be a boolean")
    inputs = _decode_inputs(_object_list(document, "inputs"), view, header_end, model_name)
    outputs, output_format = _decode_outputs(_object_list(document, "outputs"))
    output_format.binary_default = binary_default
    output_format.request_id = request_id if "id" in document else None
    request = InferRequest(model_name, model_version, request_id, inputs, outputs, parameters)
    return DecodedRequest(request, output_format)


def _json_text(body: Body, view: memoryview, header_end: int) -> bytes | bytearray:
    # The parser takes bytes and bytearray: copy out the header only when binary data follow.
    if isinstance(body, (bytes, bytearray)) and header_end == len(view):
        return body
    return view[:header_end].tobytes()


def _object_list(document: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = document.get(key, [])
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise _invalid(f"'{key}' of the inference request must be an array of objects")
    return items


def _parameters(value: Any, owner: str) -> dict[str, ParameterValue]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _invalid(f"'parameters' of {owner} must be an object")
    for key, item in value.items():
        if not isinstance(item, _PARAMETER_TYPES):
            raise _invalid(
                f"parameter '{key}' of {owner} must be a boolean, number or string, "
                f"not {type(item).__name__}"
            )
    return dict(value)


def _tensor_name(item: dict[str, Any], kind: str) -> str:
    name = item.get("name")
    if not isinstance(name, str):
        raise _invalid(f"every {kind} of the inference request needs a string 'name'")
    return name


def _shape(item: dict[str, Any], name: str) -> tuple[int, ...]:
    shape = item.get("shape")
    if not isinstance(shape, list) or not all(type(d) is int and 0 <= d <= _INT64_MAX for d in shape):
        raise _invalid(f"'shape' of input '{name}' must be an array of non-negative int64 integers")
    return tuple(shape)


def _datatype(item: dict[str, Any], name: str) -> str:
    datatype = item.get("datatype")
    if not isinstance(datatype, str) or datatype not in WIRE_TO_CODE:
        raise _invalid(f"invalid datatype for input {name}")
    return datatype


def _decode_inputs(items: list[dict[str, Any]], view: memoryview, offset: int, model: str) -> list[Tensor]:
    tensors = []
    for item in items:
        tensor, offset = _decode_input(item, view, offset, model)
        tensors.append(tensor)
    if offset != len(view):
        raise _invalid(f"unexpected additional input data for model '{model}'")
    return tensors


def _decode_input(item: dict[str, Any], view: memoryview, offset: int, model: str) -> tuple[Tensor, int]:
    """One input and the offset of the next binary input's bytes."""
    name = _tensor_name(item, "input")
    datatype = _datatype(item, name)
    shape = _shape(item, name)
    parameters = _parameters(item.get("parameters"), f"input '{name}'")
    parameters.pop("binary_data", None)
    binary_size = parameters.pop("binary_data_size", None)
    has_data = "data" in item
    data: Body
    if SHM_REGION in parameters:
        if has_data or binary_size is not None:
            raise _invalid(f"input '{name}' cannot carry data and a shared memory region")
        data = b""
    elif binary_size is not None:
        if type(binary_size) is not int or binary_size < 0:
            raise _invalid(f"'binary_data_size' of input '{name}' must be a non-negative integer")
        if has_data:
            raise _invalid(f"input '{name}' cannot carry both 'data' and 'binary_data_size'")
        if offset + binary_size > len(view):
            raise _invalid(f"unexpected size for input '{name}', expecting {binary_size} additional bytes "
                           f"for model '{model}'")
        data = view[offset : offset + binary_size]
        offset += binary_size
    elif has_data:
        data = json_to_tensor_bytes(name, datatype, shape, item["data"])
    else:
        raise _invalid(
            f"input '{name}' needs 'data', 'binary_data_size' or a 'shared_memory_region'"
        )
    return Tensor(name, datatype, shape, data, parameters), offset


def _decode_outputs(items: list[dict[str, Any]]) -> tuple[list[RequestedOutput], OutputFormat]:
    output_format = OutputFormat(requested={_tensor_name(item, "output") for item in items} or None)
    outputs = []
    for item in items:
        name = item["name"]
        parameters = _parameters(item.get("parameters"), f"output '{name}'")
        binary = parameters.pop("binary_data", None)
        if binary is not None:
            if not isinstance(binary, bool):
                raise _invalid(f"'binary_data' of output '{name}' must be a boolean")
            output_format.binary[name] = binary
        if SHM_REGION in parameters:
            output_format.shared_memory.add(name)
        outputs.append(RequestedOutput(name, parameters))
    return outputs, output_format


# -- responses -------------------------------------------------------------------------------------
@dataclass
class EncodedResponse:
    body: bytes
    headers: dict[str, str]


def encode_infer_response(response: InferResponse, output_format: OutputFormat) -> EncodedResponse:
    """The HTTP body and headers of a response; copies every output byte out of `response`.

    Raises ValueError/KeyError when an output's data do not match its datatype and shape.
    """
    entries: list[dict[str, Any]] = []
    buffers: list[memoryview] = []
    for tensor in response.outputs:
        if output_format.requested is None or tensor.name in output_format.requested:
            entries.append(_output_entry(tensor, output_format, buffers))
    document: dict[str, Any] = {"model_name": response.model_name,
                                "model_version": response.model_version}
    if output_format.request_id is not None:
        document["id"] = response.id or output_format.request_id
    if response.parameters:
        document["parameters"] = response.parameters
    document["outputs"] = entries
    header = dump_header(document)
    if not buffers:
        return EncodedResponse(header, {"Content-Type": "application/json"})
    headers = {"Content-Type": "application/octet-stream", INFERENCE_HEADER: str(len(header))}
    return EncodedResponse(b"".join([header, *buffers]), headers)


def _output_entry(
    tensor: Tensor, output_format: OutputFormat, buffers: list[memoryview]
) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype,
                             "shape": list(tensor.shape)}
    if tensor.name in output_format.shared_memory or SHM_REGION in tensor.parameters:
        # perf_analyzer breaks on a `parameters` object here
        # (docs/reference/protocol.md#compatibility-with-perf_analyzer)
        return entry
    parameters: dict[str, Any] = {
        key: value for key, value in tensor.parameters.items()
        if key not in ("binary_data", "binary_data_size")
    }
    # OutputFormat.is_binary, inline (once per output)
    if output_format.force_binary or output_format.binary.get(tensor.name, output_format.binary_default):
        buffer = _byte_view(tensor.data)
        parameters["binary_data_size"] = len(buffer)
        buffers.append(buffer)
    else:
        entry["data"] = tensor_json_value(tensor)
    if parameters:
        entry["parameters"] = parameters
    return entry


def _byte_view(data: Any) -> memoryview:
    view = memoryview(data)
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    return view.cast("B") if view.ndim != 1 or view.format != "B" else view
