"""The core link: the wire between a frontend worker and the core process.

One unix stream socket per worker, in the server's private 0700 directory. Each frame is one
msgpack map (self-delimiting: no length prefix) whose "k" names its kind:

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
import logging
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

_log = logging.getLogger("pystub.workers")

__all__ = ["HELLO", "INFER", "CANCEL", "ANSWER", "ERROR", "Frame", "TraceStamp", "FrameProtocol", "pack",
           "request_record", "request_from_record", "response_record", "response_from_record", "MAX_FRAME"]

HELLO, INFER, CANCEL, ANSWER, ERROR = "hello", "infer", "cancel", "answer", "error"
MAX_FRAME = (1 << 31) - 1  # the largest frame a reader buffers; bigger tensors must take the proxy way

Frame = dict[str, Any]


@dataclass(frozen=True)
class TraceStamp:
    """What the core needs to start a request's trace as the frontend would have."""

    traceparent: str | None
    received_start_ns: int
    received_end_ns: int


def pack(frame: Frame) -> bytes:
    return bytes(msgpack.packb(frame, use_bin_type=True))


class FrameProtocol(asyncio.Protocol):
    """One end of the link: frames in through `frame_received`, out through `send`.

    msgpack objects delimit themselves, so the stream needs no length prefix: a streaming
    unpacker takes whatever bytes arrive and yields every complete frame (no task or await per
    frame, which is most of what a request costs the core). A malformed frame closes the link.
    """

    def __init__(self) -> None:
        self._unpacker = msgpack.Unpacker(raw=False, max_buffer_size=MAX_FRAME)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a unix stream: always a Transport

    def data_received(self, data: bytes) -> None:
        self._unpacker.feed(data)
        try:
            for frame in self._unpacker:
                if not isinstance(frame, dict) or not isinstance(frame.get("k"), str):
                    raise ValueError("a frame that is not a map with a kind")
                self.frame_received(frame)
        except (ValueError, msgpack.UnpackException) as exc:
            _log.error("closing the core link: %s", exc)
            if self.transport is not None:
                self.transport.close()

    def send(self, frame: Frame) -> None:
        """Queue one frame (dropped when the link is closing: the peer is gone)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(pack(frame))

    @property
    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def frame_received(self, frame: Frame) -> None:
        raise NotImplementedError


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
