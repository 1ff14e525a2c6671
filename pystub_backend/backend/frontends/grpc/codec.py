"""Conversion between gRPC inference messages and the neutral `InferRequest`/`InferResponse`.

Pure functions, no I/O (docs/reference/protocol.md#grpc-service, #request-parameters,
#system-shared-memory-extension). Every rejection is a `ServerError` with status INVALID_ARG, so the servicer maps
it to `INVALID_ARGUMENT` like Triton's gRPC frontend.

Input data arrive either all in `raw_input_contents` (what tritonclient and perf_analyzer send;
index-aligned with the inputs that are not in shared memory) or all in typed `contents`, which
are turned into the little-endian bytes the core expects.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.frontends.grpc.protobuf_wire import (
    append_length_delimited,
    schema_of,
    split_length_delimited,
)
from pystub_backend.backend.inference import (
    Buffer,
    InferRequest,
    InferResponse,
    ParameterValue,
    RequestedOutput,
    Tensor,
)
from pystub_backend.ipc.bytes_codec import serialize_bytes
from pystub_backend.ipc.dtypes import numpy_dtype

__all__ = [
    "ParsedInferRequest",
    "ReceivedInferRequest",
    "parse_infer_request",
    "receive_infer_request",
    "decode_infer_request",
    "encode_infer_response",
    "serialize_infer_response",
    "output_bytes",
    "parameter_value",
    "parameters_from_proto",
    "parameters_to_proto",
    "repository_parameters",
    "log_settings_from_proto",
    "log_settings_to_proto",
]

_INT64_MAX = 2**63 - 1

# The typed-contents field each datatype travels in; FP16 and BF16 have none (raw only).
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
_ALL_CONTENTS_FIELDS = frozenset(_CONTENTS_FIELD.values())

# Request-level keys whose value kind Triton checks itself instead of forwarding them to the model.
_RESERVED_KINDS = {
    "sequence_id": ("int64_param", "uint64_param", "string_param"),
    "sequence_start": ("bool_param",),
    "sequence_end": ("bool_param",),
    "priority": ("int64_param", "uint64_param"),
    "timeout": ("int64_param",),
}
# Everything else a client sends at request level goes to the model, which cannot take a uint64.
_CUSTOM_KINDS = ("bool_param", "int64_param", "string_param", "double_param")

# Per-tensor shared-memory references the core interprets (docs/reference/protocol.md#system-shared-memory-extension).
_SHM_KINDS = {
    "shared_memory_region": ("string_param",),
    "shared_memory_byte_size": ("int64_param", "uint64_param"),
    "shared_memory_offset": ("int64_param", "uint64_param"),
}
# Per-tensor keys that only mean something on HTTP.
_IGNORED_TENSOR_KEYS = frozenset({"binary_data", "binary_data_size"})


def _invalid(message: str) -> ServerError:
    return ServerError(message, Status.INVALID_ARG)


# --- parameters ---------------------------------------------------------------------------------


def parameter_value(param: service_pb2.InferParameter) -> ParameterValue | None:
    """The Python value of an `InferParameter`, or None when no member of its oneof is set."""
    kind = param.WhichOneof("parameter_choice")
    return None if kind is None else getattr(param, kind)


def _checked_value(key: str, param: service_pb2.InferParameter, kinds: tuple[str, ...],
                   where: str = "") -> ParameterValue:
    kind = param.WhichOneof("parameter_choice")
    if kind not in kinds:
        raise _invalid(f"invalid value type for '{key}' parameter{where}, expected "
                       f"{' or '.join(kinds)}.")
    return getattr(param, kind)


def parameters_from_proto(
        params: Mapping[str, service_pb2.InferParameter]) -> dict[str, ParameterValue]:
    """Request-level parameters, checked the way Triton's gRPC frontend checks them.

    Raises ServerError(INVALID_ARG) for a reserved key of the wrong kind, a negative priority, or
    a custom parameter that is unset or a uint64. `triton_*` keys pass with any kind: the core
    decides which of them are allowed, for HTTP and gRPC alike.
    """
    result: dict[str, ParameterValue] = {}
    for key, param in params.items():
        if key.startswith("triton_"):
            value = parameter_value(param)
            if value is not None:
                result[key] = value
            continue
        value = _checked_value(key, param, _RESERVED_KINDS.get(key, _CUSTOM_KINDS))
        if key == "priority" and isinstance(value, int) and value < 0:
            raise _invalid(f"invalid value for 'priority' parameter, expected a non-negative "
                           f"integer, got {value}")
        result[key] = value
    return result


def _tensor_parameters(params: Mapping[str, service_pb2.InferParameter],
                       tensor: str) -> dict[str, ParameterValue]:
    """Per-input/per-output parameters: shm references type-checked, HTTP-only keys dropped."""
    result: dict[str, ParameterValue] = {}
    for key, param in params.items():
        if key in _IGNORED_TENSOR_KEYS:
            continue
        if key in _SHM_KINDS:
            result[key] = _checked_value(key, param, _SHM_KINDS[key], f" for '{tensor}'")
            continue
        value = parameter_value(param)
        if value is not None:
            result[key] = value
    return result


def parameters_to_proto(params: Mapping[str, ParameterValue], target: MutableMapping[str, service_pb2.InferParameter]
                        ) -> None:
    """Fill a proto `map<string, InferParameter>` from Python values.

    A bool is tested before int (it is one); ints beyond int64 go as uint64.
    """
    for key, value in params.items():
        param = target[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            if value > _INT64_MAX:
                param.uint64_param = value
            else:
                param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        else:
            param.string_param = str(value)


# --- request ------------------------------------------------------------------------------------


def _element_count(shape: tuple[int, ...], name: str, model: str) -> int:
    if any(dim < 0 for dim in shape):
        raise _invalid(f"unexpected shape {list(shape)} for input '{name}' for model '{model}': "
                       "dimensions must not be negative")
    return math.prod(shape)  # exact: numpy's int64 product wraps ([2**32, 2**32] would be 0)


def _contents_to_bytes(tensor: service_pb2.ModelInferRequest.InferInputTensor,
                       shape: tuple[int, ...], model: str) -> bytes:
    """Typed contents as the little-endian (or length-prefixed BYTES) data the core expects."""
    name, datatype = tensor.name, tensor.datatype
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise _invalid(f"typed contents are not supported for datatype '{datatype}' of input "
                       f"'{name}' for model '{model}'; send it in raw_input_contents")
    contents = tensor.contents
    for other in _ALL_CONTENTS_FIELDS - {field}:
        if len(getattr(contents, other)):
            raise _invalid(f"unexpected {other} for '{datatype}' input '{name}' for model "
                           f"'{model}', expected {field}")
    values = getattr(contents, field)
    expected = _element_count(shape, name, model)
    if len(values) != expected:
        raise _invalid(f"unexpected number of elements in {field} for input '{name}' for model "
                       f"'{model}': shape {list(shape)} needs {expected}, got {len(values)}")
    if datatype == "BYTES":
        return serialize_bytes(values)
    try:
        # INT8/16 and UINT8/16 travel widened to 32 bits; narrowing must not wrap silently.
        return np.array(values, dtype=numpy_dtype(datatype)).tobytes()
    except OverflowError as exc:
        raise _invalid(f"value out of range for '{datatype}' input '{name}' for model "
                       f"'{model}': {exc}") from None


def _decode_inputs(msg: service_pb2.ModelInferRequest, raw: Sequence[Buffer]) -> list[Tensor]:
    model = msg.model_name
    raw_count = len(raw)
    raw_index = 0
    inputs: list[Tensor] = []
    for tensor in msg.inputs:
        params = _tensor_parameters(tensor.parameters, tensor.name)
        shape = tuple(tensor.shape)
        data: Buffer = b""
        if "shared_memory_region" in params:
            pass  # the core reads the region; such an input has no raw_input_contents entry
        elif raw_count and tensor.HasField("contents"):
            raise _invalid(f"contents field must not be specified when using raw_input_contents "
                           f"for '{tensor.name}' for model '{model}'")
        elif raw_count:
            if raw_index < raw_count:
                data = raw[raw_index]  # one bytes object per access; passed on as it is
            raw_index += 1
        else:
            data = _contents_to_bytes(tensor, shape, model)
        inputs.append(Tensor(tensor.name, tensor.datatype, shape, data, params))
    if raw_count and raw_index != raw_count:
        raise _invalid(f"expected {raw_index} raw_input_contents (one per input not in shared "
                       f"memory) but got {raw_count} for model '{model}'")
    return inputs


# Below this many bytes protobuf's own parse (which copies raw contents) is cheaper than splitting;
# it is also bounded: 64 KiB hold at most 32,768 fields (6 ms of protobuf's parse at worst).
_SPLIT_RAW_INPUTS_FROM_BYTES = 64 << 10
# Fields a large request may have and still be taken apart on the event loop: walking them and
# parsing what is not raw contents (under 64 KiB) is well under a millisecond.
_ON_LOOP_FIELDS = 1024
_RAW_INPUT_CONTENTS = service_pb2.ModelInferRequest.DESCRIPTOR.fields_by_name["raw_input_contents"].number
_RAW_OUTPUT_CONTENTS = service_pb2.ModelInferResponse.DESCRIPTOR.fields_by_name["raw_output_contents"].number
_REQUEST_SCHEMA = schema_of(service_pb2.ModelInferRequest.DESCRIPTOR)


@dataclass(frozen=True)
class ParsedInferRequest:
    """A `ModelInferRequest` whose raw input contents may be views of the received bytes."""

    message: service_pb2.ModelInferRequest
    raw_input_contents: Sequence[Buffer]


def parse_infer_request(data: bytes) -> ParsedInferRequest:
    """Parse a serialized `ModelInferRequest` without copying large raw input contents.

    Its cost is bounded by its size and a field count (`protobuf_wire.MAX_FIELDS`), however its
    bytes are arranged. Raises protobuf's DecodeError for a malformed message or one of too many
    fields (grpc answers it).
    """
    if len(data) < _SPLIT_RAW_INPUTS_FROM_BYTES:
        message = service_pb2.ModelInferRequest.FromString(data)
        return ParsedInferRequest(message, message.raw_input_contents)
    rest, raw = split_length_delimited(data, _RAW_INPUT_CONTENTS, _REQUEST_SCHEMA)
    return ParsedInferRequest(service_pb2.ModelInferRequest.FromString(rest), raw)


@dataclass
class ReceivedInferRequest:
    """A ModelInfer request as the gRPC server hands it over: parsed already when small, else its
    bytes, for the servicer to parse off the event loop (`offload.off_loop`)."""

    data: bytes
    parsed: ParsedInferRequest | None = None

    @property
    def message(self) -> service_pb2.ModelInferRequest | None:
        """The parsed message (what the access log reads), None until parsed."""
        return None if self.parsed is None else self.parsed.message


def receive_infer_request(data: bytes) -> ParsedInferRequest | ReceivedInferRequest:
    """ModelInfer's request deserializer: small messages are parsed at once (a few ms at worst),
    and so are large ones of the usual shape (few fields, the bytes in raw contents: 5-10 µs,
    where the hop to a parsing thread and back cost hundreds); any other large one later, off the
    event loop. Raises DecodeError (grpc answers it)."""
    if len(data) < _SPLIT_RAW_INPUTS_FROM_BYTES:
        return parse_infer_request(data)
    try:
        rest, raw = split_length_delimited(data, _RAW_INPUT_CONTENTS, _REQUEST_SCHEMA, max_fields=_ON_LOOP_FIELDS)
    except DecodeError:  # malformed, or more fields than the loop takes apart: the parsing threads decide
        return ReceivedInferRequest(data)
    if len(rest) >= _SPLIT_RAW_INPUTS_FROM_BYTES:  # large typed contents or parameters: protobuf's parse is long
        return ReceivedInferRequest(data)
    return ParsedInferRequest(service_pb2.ModelInferRequest.FromString(rest), raw)


def decode_infer_request(msg: service_pb2.ModelInferRequest,
                         raw_input_contents: Sequence[Buffer] | None = None) -> InferRequest:
    """The `InferRequest` a `ModelInferRequest` describes. Raises ServerError(INVALID_ARG).

    `raw_input_contents` replaces the message's own field (see `parse_infer_request`).
    """
    raw = msg.raw_input_contents if raw_input_contents is None else raw_input_contents
    outputs = [RequestedOutput(out.name, _tensor_parameters(out.parameters, out.name))
               for out in msg.outputs]
    return InferRequest(
        model_name=msg.model_name,
        model_version=msg.model_version,
        id=msg.id,
        inputs=_decode_inputs(msg, raw),
        outputs=outputs,
        parameters=parameters_from_proto(msg.parameters),
    )


# --- response -----------------------------------------------------------------------------------


def _output_view(tensor: Tensor) -> bytes | memoryview:
    """The output's data as bytes, viewing its (possibly shared-memory) buffer; empty for
    client-shm outputs. The caller copies it before the response is released."""
    if "shared_memory_region" in tensor.parameters:
        return b""
    data = tensor.data
    if isinstance(data, bytes):
        return data
    if isinstance(data, np.ndarray) and data.dtype.hasobject:
        # numpy exports object arrays as raw pointers; BYTES must arrive serialized
        raise TypeError(f"output '{tensor.name}' holds a numpy object array, not tensor bytes")
    view = data.data if isinstance(data, np.ndarray) else memoryview(data)
    if not view.c_contiguous:
        return view.tobytes()  # in C order, like numpy's tobytes
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _response_head(response: InferResponse) -> service_pb2.ModelInferResponse:
    """Everything of the response message but its raw output contents."""
    msg = service_pb2.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id,
    )
    parameters_to_proto(response.parameters, msg.parameters)
    for tensor in response.outputs:
        out = msg.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        parameters_to_proto({k: v for k, v in tensor.parameters.items()
                             if k not in _SHM_KINDS and k not in _IGNORED_TENSOR_KEYS},
                            out.parameters)
    return msg


def encode_infer_response(response: InferResponse) -> service_pb2.ModelInferResponse:
    """A `ModelInferResponse` with one `raw_output_contents` entry per output, in output order.

    Holds no reference to the response's buffers afterwards, so the caller may `release()` it.
    Shared-memory parameters of outputs are not echoed (Triton's gRPC responses carry none).
    """
    msg = _response_head(response)
    msg.raw_output_contents.extend(output_bytes(tensor) for tensor in response.outputs)
    return msg


def output_bytes(tensor: Tensor) -> bytes:
    """The output's data as a `raw_output_contents` entry (a copy; empty for client-shm outputs)."""
    return bytes(_output_view(tensor))


def serialize_infer_response(response: InferResponse) -> bytes:
    """`encode_infer_response(response).SerializeToString()`, with the output data copied once
    (straight from the buffers into the result) instead of through protobuf's slow bytes fields."""
    head = _response_head(response).SerializeToString()
    return append_length_delimited(head, _RAW_OUTPUT_CONTENTS,
                                   [_output_view(tensor) for tensor in response.outputs])


# --- model repository and logging extensions -------------------------------------------------------


def _set_oneof_values(params: Mapping[str, Any]) -> dict[str, Any]:
    """The values of a map of `parameter_choice` oneofs; an entry with no member set is left out."""
    result: dict[str, Any] = {}
    for key, param in params.items():
        kind = param.WhichOneof("parameter_choice")
        if kind is not None:
            result[key] = getattr(param, kind)
    return result


def repository_parameters(params: Mapping[str, Any]) -> dict[str, Any]:
    """`RepositoryModelLoad`/`Unload` parameters as Python values (bool, int, str or bytes); a
    parameter with no member of its oneof set is left out."""
    return _set_oneof_values(params)


def log_settings_from_proto(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A `LogSettingsRequest`'s settings as Python values; unset values mean "unchanged"."""
    return _set_oneof_values(settings)


def log_settings_to_proto(settings: Mapping[str, Any]) -> service_pb2.LogSettingsResponse:
    response = service_pb2.LogSettingsResponse()
    for key, value in settings.items():
        target = response.settings[key]
        if isinstance(value, bool):
            target.bool_param = value
        elif isinstance(value, int):
            target.uint32_param = value
        else:
            target.string_param = str(value)
    return response
