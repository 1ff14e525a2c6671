"""The core link: the wire between a frontend worker and the core process.

One unix stream socket per worker, in the server's private 0700 directory. Each frame is a 4-byte
big-endian length followed by one msgpack map whose "k" names its kind:

    kind      direction        fields
    hello     worker -> core   index, pid            (sent once the worker listens on the ports)
    infer     worker -> core   id, protocol ("HTTP" | "GRPC"), request (see `request_record`),
                               trace (traceparent or None, received start/end in monotonic ns)
    cancel    worker -> core   id, task: the caller was cancelled (gRPC deadline or cancel): the
                               core cancels the request's task; else the HTTP client left mid-request:
                               the core closes the request's ClientLink (backend/client_link.py)
    answer    core -> worker   id, response (see `response_record`)
    error     core -> worker   id, status (Status value), message

Several requests are in flight on one connection; `id` (chosen by the worker, unique per
connection) matches an answer or error to its request. Tensor bytes travel inline in the frame:
one copy each way (a shared arena would save that copy for large tensors; docs/frontend-workers.md).
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from pystub_backend.backend.inference import (
    InferRequest,
    InferResponse,
    ParameterValue,
    RequestedOutput,
    Tensor,
    buffer_view,
)

__all__ = ["HELLO", "INFER", "CANCEL", "ANSWER", "ERROR", "Frame", "TraceStamp", "LinkClosedError",
           "read_frame", "write_frame", "request_record", "request_from_record", "response_record",
           "response_from_record", "MAX_FRAME"]

HELLO, INFER, CANCEL, ANSWER, ERROR = "hello", "infer", "cancel", "answer", "error"
_LENGTH = struct.Struct(">I")
MAX_FRAME = (1 << 32) - 1  # the length field's limit; tensors bigger than ~4 GiB take the proxy way

Frame = dict[str, Any]


class LinkClosedError(ConnectionError):
    """The peer closed the link (or it broke) while a frame was expected or in flight."""


@dataclass(frozen=True)
class TraceStamp:
    """What the core needs to start a request's trace as the frontend would have."""

    traceparent: str | None
    received_start_ns: int
    received_end_ns: int


def _pack(frame: Frame) -> bytes:
    return bytes(msgpack.packb(frame, use_bin_type=True))


def write_frame(writer: asyncio.StreamWriter, frame: Frame) -> None:
    """Queue one frame on `writer` (one write call: frames of concurrent tasks never interleave)."""
    body = _pack(frame)
    writer.write(_LENGTH.pack(len(body)) + body)


async def read_frame(reader: asyncio.StreamReader) -> Frame:
    """The next frame. Raises LinkClosedError at end of stream or on a malformed frame."""
    try:
        head = await reader.readexactly(_LENGTH.size)
        body = await reader.readexactly(_LENGTH.unpack(head)[0])
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        raise LinkClosedError("the core link closed") from exc
    frame = msgpack.unpackb(body, raw=False)
    if not isinstance(frame, dict) or not isinstance(frame.get("k"), str):
        raise LinkClosedError("a malformed frame on the core link")
    return frame


# -- records: requests and responses as msgpack-able lists ------------------------------------------


def _tensor_record(tensor: Tensor) -> list[Any]:
    return [tensor.name, tensor.datatype, list(tensor.shape), buffer_view(tensor.data).cast("B"),
            tensor.parameters]


def _tensor(record: list[Any]) -> Tensor:
    name, datatype, shape, data, parameters = record
    return Tensor(name, datatype, tuple(shape), data, parameters)


def request_record(request: InferRequest) -> list[Any]:
    """The request as it crosses the link (tracing travels beside it, as a TraceStamp)."""
    return [request.model_name, request.model_version, request.id,
            [_tensor_record(tensor) for tensor in request.inputs],
            [[output.name, output.parameters] for output in request.outputs], request.parameters]


def request_from_record(record: list[Any]) -> InferRequest:
    model, version, request_id, inputs, outputs, parameters = record
    requested = [RequestedOutput(name, dict[str, ParameterValue](params)) for name, params in outputs]
    return InferRequest(model, version, request_id, [_tensor(item) for item in inputs], requested, parameters)


def response_record(response: InferResponse) -> list[Any]:
    """The response with every output byte copied out (the caller then releases the response)."""
    outputs = [[t.name, t.datatype, list(t.shape), bytes(buffer_view(t.data).cast("B")), t.parameters]
               for t in response.outputs]
    return [response.model_name, response.model_version, response.id, outputs, response.parameters]


def response_from_record(record: list[Any]) -> InferResponse:
    model, version, response_id, outputs, parameters = record
    return InferResponse(model, version, response_id, [_tensor(item) for item in outputs], parameters)
