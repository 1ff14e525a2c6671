"""The core link: the wire between a frontend worker and the core process.

One unix stream socket per worker, in the server's private 0700 directory. Its messages are those
of the catalogue (`pystub_backend.ipc.messages.workers`, kinds 70-79: typed records, decoded and
checked by `pystub_backend.ipc.wire` as a stub's are); this module frames them on the stream and
turns requests and responses into their records and back.

Framing: each frame is the message's msgpack array `[kind, field, ...]`, which delimits itself, so
the stream needs no length prefix: a streaming unpacker takes whatever bytes arrive and yields
every complete frame (no task or await per frame, which is most of what a request costs the core).
A frame that is not a link message closes the link.

Lossless: the frontends hand the core Python ints of any size and str with lone surrogates (JSON
allows both), and the core must judge them as an in-process frontend's: an int past 64 bits
travels as an ext value holding its decimal digits, and text is packed with `surrogatepass`.
Tensor bytes travel inline in the frame: one copy each way (docs/frontend-workers.md).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, NamedTuple

import msgpack

from pystub_backend.backend.inference import InferRequest, InferResponse, RequestedOutput, Tensor, buffer_view
from pystub_backend.ipc.messages.workers import (
    LINK_MESSAGES,
    LinkOutput,
    LinkRequest,
    LinkResponse,
    LinkTensor,
)
from pystub_backend.ipc.wire import from_array, to_array

_log = logging.getLogger("pystub.workers")

__all__ = ["FrameProtocol", "pack", "request_record", "request_from_record", "response_record",
           "response_from_record", "MAX_FRAME"]

MAX_FRAME = (1 << 31) - 1  # the largest frame a reader buffers; bigger tensors must take the proxy way
_BIG_INT = 1  # msgpack ext type: an int past 64 bits, as its decimal digits


def _big_int(value: object) -> msgpack.ExtType:
    if isinstance(value, int):  # msgpack asks only for what it cannot pack: here, an int past 64 bits
        return msgpack.ExtType(_BIG_INT, str(value).encode())
    raise TypeError(f"cannot send a {type(value).__name__} over the core link")


def _ext(code: int, data: bytes) -> object:
    if code == _BIG_INT:
        return int(data)
    raise ValueError(f"unknown msgpack ext type {code} on the core link")


_PACKER = msgpack.Packer(use_bin_type=True, default=_big_int)
_LOSSLESS_TEXT = msgpack.Packer(use_bin_type=True, default=_big_int, unicode_errors="surrogatepass")


def pack(message: NamedTuple) -> bytes:
    """The frame of a link message."""
    array = to_array(message)
    try:
        return _PACKER.pack(array)
    except UnicodeEncodeError:  # a lone surrogate somewhere: the slower packer keeps it
        return _LOSSLESS_TEXT.pack(array)


class FrameProtocol(asyncio.Protocol):
    """One end of the link: messages in through `message_received`, out through `send`."""

    def __init__(self) -> None:
        self._unpacker = msgpack.Unpacker(raw=False, max_buffer_size=MAX_FRAME, strict_map_key=False,
                                          unicode_errors="surrogatepass", ext_hook=_ext)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a unix stream: always a Transport

    def data_received(self, data: bytes) -> None:
        self._unpacker.feed(data)
        try:
            for items in self._unpacker:
                message = from_array(items)
                if type(message) not in LINK_MESSAGES:
                    raise ValueError(f"a {type(message).__name__} message is not a core link message")
                self.message_received(message)
        except (ValueError, msgpack.UnpackException) as exc:  # MessageDecodeError is a ValueError
            _log.error("closing the core link: %s", exc)
            if self.transport is not None:
                self.transport.close()

    def send(self, message: NamedTuple) -> None:
        """Queue one message (dropped when the link is closing: the peer is gone)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(pack(message))

    @property
    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def message_received(self, message: Any) -> None:
        """One decoded link message (one of LINK_MESSAGES)."""
        raise NotImplementedError


# -- requests and responses as their link records ----------------------------------------------------


def _tensor_record(tensor: Tensor) -> LinkTensor:
    return LinkTensor(tensor.name, tensor.datatype, list(tensor.shape), buffer_view(tensor.data).cast("B"),
                      tensor.parameters)


def _tensor(record: LinkTensor) -> Tensor:
    return Tensor(record.name, record.datatype, tuple(record.shape), record.data, record.parameters)


def request_record(request: InferRequest) -> LinkRequest:
    """The request as it crosses the link (tracing travels beside it, as a LinkTrace)."""
    return LinkRequest(request.model_name, request.model_version, request.id,
                       [_tensor_record(tensor) for tensor in request.inputs],
                       [LinkOutput(output.name, output.parameters) for output in request.outputs],
                       request.parameters)


def request_from_record(record: LinkRequest) -> InferRequest:
    requested = [RequestedOutput(output.name, output.parameters) for output in record.outputs]
    return InferRequest(record.model, record.version, record.id, [_tensor(item) for item in record.inputs],
                        requested, record.parameters)


def response_record(response: InferResponse) -> LinkResponse:
    """The response with every output byte copied out (the caller then releases the response)."""
    outputs = [LinkTensor(t.name, t.datatype, list(t.shape), bytes(buffer_view(t.data).cast("B")), t.parameters)
               for t in response.outputs]
    return LinkResponse(response.model_name, response.model_version, response.id, outputs, response.parameters)


def response_from_record(record: LinkResponse) -> InferResponse:
    return InferResponse(record.model, record.version, record.id, [_tensor(item) for item in record.outputs],
                         record.parameters)
