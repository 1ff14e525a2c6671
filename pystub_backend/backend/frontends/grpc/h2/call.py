"""One gRPC call: an HTTP/2 stream's messages in and out, its deadline and its cancellation.

Inbound: inbound.py (flow control, the connection's memory budget, inflating, the request-read
timeout, exactly one message for a unary call).

Outbound: `send_message` queues the message in libnghttp2 and waits while more than
`_HIGH_WATER` bytes of this stream are queued there, that is while the client does not read
(its window is shut) or the socket does not drain. The handler stops, and what it holds stays
bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

import grpc

from pystub_backend.backend.frontends.grpc.h2.inbound import TOO_MANY_REQUESTS, Inbound, MemoryBudget
from pystub_backend.backend.frontends.grpc.h2.wire import (
    ACCEPT_ENCODING,
    Header,
    MessageReader,
    Metadata,
    WireError,
    frame_parts,
    metadata_headers,
    status_headers,
)

__all__ = ["ServerCall", "Link", "DEADLINE_DETAILS"]

DEADLINE_DETAILS = "Deadline Exceeded"
# One 64 KiB message ahead of the socket keeps a reading client's stream full; more only held memory
# for unread streams (256 KiB: a frontend worker with 40 of them grew twice as much, measured).
_HIGH_WATER = 64 << 10
_CONTENT_TYPE = (b"content-type", b"application/grpc")
_OK = (b":status", b"200")
_ACCEPT = (b"grpc-accept-encoding", ACCEPT_ENCODING)


class Link(Protocol):
    """What a call needs of its connection."""

    def submit_headers(self, stream_id: int, headers: list[Header], end: bool) -> None: ...

    def submit_message(self, stream_id: int, prefix: bytes, body: bytes) -> None: ...

    def submit_trailers(self, stream_id: int, headers: list[Header]) -> None: ...

    def acknowledge(self, stream_id: int, amount: int) -> None: ...

    def queued(self, stream_id: int) -> int: ...

    async def writable(self, stream_id: int) -> None: ...

    def call_ended(self, call: ServerCall) -> None:
        """The call has its status (or is gone): the connection forgets it."""


class ServerCall:
    """The state of one call; the connection feeds it and the dispatcher drives it."""

    def __init__(self, link: Link, stream_id: int, method: str, metadata: Metadata, peer: str,
                 deadline: float | None, reader: MessageReader, response_encoding: str | None,
                 budget: MemoryBudget | None = None) -> None:
        self.link, self.stream_id, self.method = link, stream_id, method
        self.metadata, self.peer, self.deadline = metadata, peer, deadline
        self.requests = Inbound(reader, budget or MemoryBudget(-1), self._acknowledge)
        self.requests.on_too_many = self._too_many
        self._encoding = response_encoding
        self.headers_sent = False
        self.finished = False  # status sent (or the stream is gone)
        self.cancelled = False  # the client reset the stream or went away
        self.expired = False  # the deadline passed
        self.task: asyncio.Task[None] | None = None
        self.deadline_timer: asyncio.TimerHandle | None = None
        self.max_send = -1  # grpc.max_send_message_length (-1: no limit)

    # -- inbound (inbound.py) ----------------------------------------------------------------------
    def feed(self, data: bytes, end: bool) -> None:
        """DATA from the client (and END_STREAM with it)."""
        self.requests.feed(data, end)

    def _acknowledge(self, amount: int) -> None:
        self.link.acknowledge(self.stream_id, amount)

    async def next_request(self) -> bytes | None:
        """The next request message; None once the client has sent its last. Raises WireError."""
        return await self.requests.next()

    async def single_request(self) -> bytes:
        """The one message of a unary request. Raises WireError when there is not exactly one."""
        return await self.requests.single()

    def _too_many(self) -> None:
        """A second message on a unary call: it ends INTERNAL, its handler cancelled."""
        self.finish(grpc.StatusCode.INTERNAL, TOO_MANY_REQUESTS)
        if self.task is not None:
            self.task.cancel()

    # -- outbound --------------------------------------------------------------------------------
    def send_headers(self, metadata: Sequence[tuple[str, str | bytes]] = ()) -> None:
        """The response's HEADERS, with initial metadata; once."""
        if self.headers_sent or self.finished:
            return
        self.headers_sent = True
        headers = [_OK, _CONTENT_TYPE, _ACCEPT]
        if self._encoding is not None:
            headers.append((b"grpc-encoding", self._encoding.encode()))
        headers.extend(metadata_headers(metadata))
        self.link.submit_headers(self.stream_id, headers, False)

    async def send_message(self, payload: bytes) -> None:
        """Queue one response message; waits while the stream's queue is over its high water.
        Raises WireError (RESOURCE_EXHAUSTED) for a message over the send limit."""
        if self.finished:
            raise asyncio.CancelledError("the call has ended")
        self._check_size(payload)
        self.send_headers()
        self.link.submit_message(self.stream_id, *frame_parts(payload, self._encoding))
        while not self.finished and self.link.queued(self.stream_id) > _HIGH_WATER:
            await self.link.writable(self.stream_id)

    def send_unary(self, payload: bytes) -> None:
        """A unary response's message, with no wait: the status follows at once."""
        self._check_size(payload)
        self.send_headers()
        self.link.submit_message(self.stream_id, *frame_parts(payload, self._encoding))

    def _check_size(self, payload: bytes) -> None:
        if 0 <= self.max_send < len(payload):
            raise WireError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"Sent message larger than max ({len(payload)} vs. {self.max_send})")

    def finish(self, code: grpc.StatusCode, details: str | None,
               trailing: Sequence[tuple[str, str | bytes]] = ()) -> None:
        """Send the status: trailers, or a trailers-only response when no HEADERS went yet."""
        if self.finished:
            return
        self.finished = True
        self.requests.close()
        status = status_headers(code, details, trailing)
        if self.headers_sent:
            self.link.submit_trailers(self.stream_id, status)
        else:
            self.link.submit_headers(self.stream_id, [_OK, _CONTENT_TYPE, *status], True)
        self.link.call_ended(self)

    # -- ending without a status ---------------------------------------------------------------
    def cancel(self) -> None:
        """The client reset the stream or the connection went: the handler's task is cancelled."""
        if self.finished:
            return
        self.cancelled = self.finished = True
        self.requests.close()
        if self.task is not None:
            self.task.cancel()
        self.link.call_ended(self)

    def expire(self) -> None:
        """The deadline passed: the handler is cancelled and the call ends DEADLINE_EXCEEDED."""
        if self.finished or self.task is None:
            return
        self.expired = True
        self.task.cancel()
