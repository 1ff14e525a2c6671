"""Read timeouts of the HTTP listeners: a slow or silent client cannot hold a connection open.

aiohttp has no header or body read timeout (its keep-alive timer is an hour by default and does
not watch a request in progress), so a client sending one header line, or one body byte, every
9 s kept its connection, a file descriptor and a parser forever. `TimedAppRunner` serves an app
with `TimedRequestHandler`, aiohttp's connection protocol plus one timer per connection:

    connect ──► HEAD: the whole request head must arrive within `header_seconds` of the
                │     connection (or of a kept-alive request's first byte); an idle
                │     connection counts as a head that never came
                ▼ head parsed, body expected
                BODY: the body must arrive within `body_seconds`, extended by one second per
                │     MIN_BODY_RATE bytes received (a large upload on a slow link finishes;
                │     one byte every 9 s does not)
                ▼ body complete
                IDLE: the handler runs; waiting for the next request is aiohttp's keep-alive
    timer fires ──► the connection is closed without a response (as Triton's server does).

The fast path pays three integer updates per read: the timer is armed lazily, so the requests of
a kept-alive connection share one (it re-arms when it fires early). The protocol also counts what
its connection received: one that carried `TRIM_AFTER_BYTES` or more asks the runner's
`HeapTrimmer` for a trim when it closes (frontends/heap_trim.py), as the h2 gRPC stack's
connections do.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from pystub_backend.backend.frontends.heap_trim import TRIM_AFTER_BYTES, HeapTrimmer
from pystub_backend.backend.frontends.http.client_errors import QuietClientErrors

__all__ = ["DEFAULT_BODY_SECONDS", "DEFAULT_HEADER_SECONDS", "MIN_BODY_RATE", "ReadTimeouts", "TimedAppRunner"]

_log = logging.getLogger(__name__)

DEFAULT_HEADER_SECONDS = 30.0  # Apache's mod_reqtimeout allows 20-40 s for the head
DEFAULT_BODY_SECONDS = 60.0
MIN_BODY_RATE = 64 * 1024  # bytes per second that extend the body deadline by one second


@dataclass(frozen=True)
class ReadTimeouts:
    """`--http-header-timeout-secs` and `--http-body-timeout-secs`; 0 turns one off."""

    header_seconds: float = DEFAULT_HEADER_SECONDS
    body_seconds: float = DEFAULT_BODY_SECONDS


class _Phase(enum.Enum):
    HEAD = "head"
    BODY = "body"
    IDLE = "idle"


class TimedRequestHandler(QuietClientErrors):
    """aiohttp's connection protocol with the header and body deadlines of `ReadTimeouts` (and
    malformed requests answered without a traceback: client_errors)."""

    def __init__(self, manager: Server, *, read_timeouts: ReadTimeouts, heap: HeapTrimmer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._timeouts = read_timeouts
        self._heap = heap
        self._carried = 0  # bytes received over the connection's life
        self._phase = _Phase.IDLE
        self._deadline: float | None = None  # the current phase's (before a body's extension)
        self._body: StreamReader | None = None
        self._body_received = 0
        self._timer: asyncio.TimerHandle | None = None
        # Called once when the connection drops (client_link.http_request_link registers here, so
        # a request learns at once that its client left; aiohttp does not cancel the handler).
        self.lost_callbacks: dict[object, Callable[[], None]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._enter(_Phase.HEAD, self._timeouts.header_seconds)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_timer()
        self._body = None
        super().connection_lost(exc)
        callbacks, self.lost_callbacks = self.lost_callbacks, {}
        for callback in callbacks.values():
            callback()
        if self._carried >= TRIM_AFTER_BYTES:
            self._heap.released()

    def data_received(self, data: bytes) -> None:
        if self._phase is _Phase.IDLE and data and self._body is None:
            self._enter(_Phase.HEAD, self._timeouts.header_seconds)  # a kept-alive connection's next request
        heads = self._request_count
        self._carried += len(data)
        super().data_received(data)
        if self._phase is _Phase.BODY:
            self._body_received += len(data)
        if self._request_count != heads and self._messages:
            self._head_parsed(self._messages[-1][1])
        if self._body is not None and self._body.is_eof():
            self._body = None
            self._enter(_Phase.IDLE, 0.0)

    def _head_parsed(self, payload: StreamReader) -> None:
        if payload.is_eof():  # no body, or all of it came with the head
            self._enter(_Phase.IDLE, 0.0)
            return
        self._body, self._body_received = payload, 0
        self._enter(_Phase.BODY, self._timeouts.body_seconds)

    def _enter(self, phase: _Phase, seconds: float) -> None:
        """Start `phase` with its deadline. The timer is lazy: one armed no later than the new
        deadline stays (it finds the deadline moved when it fires, and re-arms), so a kept-alive
        connection's requests do not each make and cancel a timer."""
        self._phase = phase
        if phase is _Phase.IDLE or seconds <= 0:
            self._deadline = None
            return
        self._deadline = self._loop.time() + seconds
        if self._timer is None or self._timer.when() > self._deadline:
            self._cancel_timer()
            self._timer = self._loop.call_at(self._deadline, self._expired)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self._deadline is None:  # idle: the next request's head arms a timer again
            return
        allowed = self._deadline
        if self._phase is _Phase.BODY:  # a body arriving fast enough earns more time
            allowed += self._body_received / MIN_BODY_RATE
        if self._loop.time() < allowed:
            self._timer = self._loop.call_at(allowed, self._expired)
            return
        _log.debug("closing an HTTP connection: the request %s did not arrive in time", self._phase.value)
        self._phase, self._deadline = _Phase.IDLE, None
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
