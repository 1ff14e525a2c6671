"""Read timeouts of the aiohttp listeners (the metrics and OpenAI ports): `TimedAppRunner` serves
an app with `TimedRequestHandler`, aiohttp's connection protocol plus the read deadlines of
connection.py's ReadDeadlines (aiohttp has no header or body read timeout; its keep-alive timer is
an hour by default and does not watch a request in progress). The inference port's own protocol
(connection.py) keeps the same deadlines.

The fast path pays three integer updates per read. The protocol also counts what its connection
received: one that carried `TRIM_AFTER_BYTES` or more asks the runner's `HeapTrimmer` for a trim
when it closes (frontends/heap_trim.py), as the h2 gRPC stack's connections do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from pystub_backend.backend.frontends.heap_trim import TRIM_AFTER_BYTES, HeapTrimmer
from pystub_backend.backend.frontends.http.client_errors import QuietClientErrors
from pystub_backend.backend.frontends.http.connection import (
    DEFAULT_BODY_SECONDS,
    DEFAULT_HEADER_SECONDS,
    MIN_BODY_RATE,
    Phase,
    ReadDeadlines,
    ReadTimeouts,
)

__all__ = ["DEFAULT_BODY_SECONDS", "DEFAULT_HEADER_SECONDS", "MIN_BODY_RATE", "ReadTimeouts", "TimedAppRunner"]

_log = logging.getLogger(__name__)


class TimedRequestHandler(QuietClientErrors):
    """aiohttp's connection protocol with the header and body deadlines of `ReadTimeouts` (and
    malformed requests answered without a traceback: client_errors)."""

    def __init__(self, manager: Server, *, read_timeouts: ReadTimeouts, heap: HeapTrimmer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._deadlines = ReadDeadlines(self._loop, read_timeouts, self._expired)
        self._heap = heap
        self._carried = 0  # bytes received over the connection's life
        self._body: StreamReader | None = None
        # Called once when the connection drops (http/client_link.py registers here, so a request
        # learns at once that its client left; aiohttp does not cancel the handler).
        self.lost_callbacks: dict[object, Callable[[], None]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._deadlines.head()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._deadlines.cancel()
        self._body = None
        super().connection_lost(exc)
        callbacks, self.lost_callbacks = self.lost_callbacks, {}
        for callback in callbacks.values():
            callback()
        if self._carried >= TRIM_AFTER_BYTES:
            self._heap.released()

    def data_received(self, data: bytes) -> None:
        deadlines = self._deadlines
        if deadlines.phase is Phase.IDLE and data and self._body is None:
            deadlines.head()  # a kept-alive connection's next request
        heads = self._request_count
        self._carried += len(data)
        super().data_received(data)
        if deadlines.phase is Phase.BODY:
            deadlines.body_received += len(data)
        if self._request_count != heads and self._messages:
            self._head_parsed(self._messages[-1][1])
        if self._body is not None and self._body.is_eof():
            self._body = None
            deadlines.idle()

    def _head_parsed(self, payload: StreamReader) -> None:
        if payload.is_eof():  # no body, or all of it came with the head
            self._deadlines.idle()
            return
        self._body = payload
        self._deadlines.body()

    def _expired(self, phase: Phase) -> None:
        _log.debug("closing an HTTP connection: the request %s did not arrive in time", phase.value)
        self.force_close()


class _TimedServer(Server):
    """aiohttp's `Server` (the protocol factory) making `TimedRequestHandler`s."""

    def __init__(self, *args: Any, read_timeouts: ReadTimeouts, heap: HeapTrimmer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timeouts = read_timeouts
        self._heap = heap

    def __call__(self) -> RequestHandler:
        return TimedRequestHandler(self, loop=self._loop, read_timeouts=self._read_timeouts, heap=self._heap,
                                   **self._kwargs)


class TimedAppRunner(web.AppRunner):
    """`web.AppRunner` whose connections have read timeouts, and give the heap back when one that
    carried much closes."""

    def __init__(self, app: web.Application, *, read_timeouts: ReadTimeouts, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._read_timeouts = read_timeouts
        self.heap = HeapTrimmer()

    async def cleanup(self) -> None:
        await super().cleanup()
        self.heap.cancel()  # a trim the last closes asked for: the loop is about to go

    async def _make_server(self) -> Server:
        # The app's own factory, rebuilt with the same arguments as the timed subclass.
        plain = await super()._make_server()
        return _TimedServer(plain.request_handler, request_factory=plain.request_factory,
                            handler_cancellation=plain.handler_cancellation, loop=plain._loop,
                            read_timeouts=self._read_timeouts, heap=self.heap, **plain._kwargs)
