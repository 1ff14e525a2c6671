"""One client connection of the HTTP listener: HTTP/1.1 parsed by `httptools` (llhttp, strict), its
requests handed to the app one at a time, in order, and their responses written back.

    data_received ─► parser callbacks ─► HttpRequest (head complete) ─► queue ─► one task per
                     (limits checked)     body chunks fed as they come          request: app.handle
    the response ◄── written in one piece (head + body) when the handler returns, then the next

Pipelining: requests queue behind the one in progress (at most `MAX_QUEUED`; then, or while more
than request.HIGH_WATER body bytes wait unread, the connection stops reading from the client).
Keep-alive follows HTTP/1.0 and 1.1 (`Connection`); a request that asks to close, a malformed
head or an upgrade of a request with a chunked body end the connection after the responses before
them. `Expect: 100-continue` is answered by the app when the handler starts (as aiohttp did).

Limits (aiohttp's, which served this port before): a request target of at most 8190 bytes, a
header name plus value of at most 8190, at most 128 headers, `Host` required in HTTP/1.1, single
Content-Length, Content-Type, Host ...: the target as it arrives, a header once its line is
complete (httptools reports no less). A line that does not end is refused once `MAX_INCOMPLETE_FIELD`
bytes came since the last complete one (8190 plus one read of the socket, so no line within the
limits is refused for the bytes of the requests before it in the same read). A malformed
head gets `400` with the parser's reason as text (HTTP/1.0, as aiohttp) and the connection closes;
it is logged at debug level only (client_errors.py), and at --log-verbose 1 by its access line.

A client that leaves: its body reader fails, the request in progress hears it (it is its own client
link, messages.py; an inference's task is cancelled, down to the model), `lost_callbacks` run
(request_link.py's links), nothing is written any more. Read deadlines as `ReadDeadlines`
(below) draws them; a connection that carried `TRIM_AFTER_BYTES` asks the listener's heap trimmer for a trim
when it closes.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, cast

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from pystub_backend.backend.frontends.heap_trim import TRIM_AFTER_BYTES, HeapTrimmer
from pystub_backend.backend.frontends.http.messages import (
    HIGH_WATER,
    Answer,
    HttpRequest,
    InvalidTarget,
    Response,
    StreamResponse,
    encode_head,
    split_target,
    text_response,
)
from pystub_backend.backend.log import settings as log_settings
from pystub_backend.backend.log import verbose

__all__ = ["HttpConnection", "ConnectionSettings", "Application", "MAX_QUEUED", "KEEP_ALIVE_SECONDS",
           "MAX_LINE", "MAX_FIELD", "MAX_HEADERS", "MAX_INCOMPLETE_FIELD", "DEFAULT_BODY_SECONDS",
           "DEFAULT_HEADER_SECONDS", "MIN_BODY_RATE", "Phase", "ReadDeadlines", "ReadTimeouts"]

_log = logging.getLogger(__name__)
_client_log = logging.getLogger("pystub.http")  # client_errors.py's logger: malformed requests

MAX_LINE = 8190  # bytes of a request target
MAX_FIELD = 8190  # bytes of a header's name and value together
MAX_HEADERS = 128
_READ_SIZE = 256 * 1024  # the most one data_received brings (asyncio's selector transports)
MAX_INCOMPLETE_FIELD = MAX_FIELD + _READ_SIZE
MAX_QUEUED = 32  # pipelined requests waiting behind the one in progress (aiohttp's queue)
KEEP_ALIVE_SECONDS = 3630.0  # an idle kept-alive connection closes after this (aiohttp's default)
_SMALL_BODY = 64 * 1024  # a body up to this is joined to its head: one write, one send
# Headers a request may carry once (aiohttp's SINGLETON_HEADERS): two would be read two ways.
_SINGLETONS = ("Content-Length", "Content-Location", "Content-Range", "Content-Type", "ETag", "Host", "Max-Forwards",
               "Server", "Transfer-Encoding", "User-Agent")
_VERSIONS = {"1.1": (1, 1), "1.0": (1, 0)}


# -- read deadlines -------------------------------------------------------------------------------
# Read deadlines of an HTTP connection: a slow or silent client cannot hold a connection open.
#
# A client sending one header line, or one body byte, every 9 s would otherwise keep its connection,
# a file descriptor and a parser forever. One `ReadDeadlines` per connection, driven by the
# connection's protocol (HttpConnection below for the inference port, timeouts.py for aiohttp's):
#
#     connect ──► HEAD: the whole request head must arrive within `header_seconds` of the
#                 │     connection (or of a kept-alive request's first byte); an idle
#                 │     connection counts as a head that never came
#                 ▼ head parsed, body expected
#                 BODY: the body must arrive within `body_seconds`, extended by one second per
#                 │     MIN_BODY_RATE bytes received (a large upload on a slow link finishes;
#                 │     one byte every 9 s does not)
#                 ▼ body complete
#                 IDLE: the handler runs, then the connection waits for the next request: no
#                       deadline, or the keep-alive one the protocol gives
#     deadline passes ──► `expired(phase)`: the protocol closes the connection without a response
#                         (as Triton's server does)
#
# The timer is lazy: one armed no later than the new deadline stays (it finds the deadline moved when
# it fires, and re-arms), so the requests of a kept-alive connection share one instead of each making
# and cancelling a timer; a phase change costs a clock read.

DEFAULT_HEADER_SECONDS = 30.0  # Apache's mod_reqtimeout allows 20-40 s for the head
DEFAULT_BODY_SECONDS = 60.0
MIN_BODY_RATE = 64 * 1024  # bytes per second that extend the body deadline by one second


@dataclass(frozen=True)
class ReadTimeouts:
    """`--http-header-timeout-secs` and `--http-body-timeout-secs`; 0 turns one off."""

    header_seconds: float = DEFAULT_HEADER_SECONDS
    body_seconds: float = DEFAULT_BODY_SECONDS


class Phase(enum.Enum):
    HEAD = "head"
    BODY = "body"
    IDLE = "idle"


class ReadDeadlines:
    """The deadline of a connection's current phase; `expired(phase)` when it passes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeouts: ReadTimeouts,
                 expired: Callable[[Phase], None]) -> None:
        self._loop = loop
        self._timeouts = timeouts
        self._expired_callback = expired
        self.phase = Phase.IDLE
        self._deadline: float | None = None  # the current phase's (before a body's extension)
        self.body_received = 0
        self._timer: asyncio.TimerHandle | None = None

    def head(self) -> None:
        self._enter(Phase.HEAD, self._timeouts.header_seconds)

    def body(self) -> None:
        self.body_received = 0
        self._enter(Phase.BODY, self._timeouts.body_seconds)

    def idle(self, keep_alive_seconds: float = 0.0) -> None:
        self._enter(Phase.IDLE, keep_alive_seconds)

    def cancel(self) -> None:
        self.phase, self._deadline = Phase.IDLE, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _enter(self, phase: Phase, seconds: float) -> None:
        self.phase = phase
        if seconds <= 0:
            self._deadline = None
            return
        self._deadline = self._loop.time() + seconds
        if self._timer is None or self._timer.when() > self._deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(self._deadline, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if self._deadline is None:  # no deadline now: the next phase's arms a timer again
            return
        allowed = self._deadline
        if self.phase is Phase.BODY:  # a body arriving fast enough earns more time
            allowed += self.body_received / MIN_BODY_RATE
        if self._loop.time() < allowed:
            self._timer = self._loop.call_at(allowed, self._fire)
            return
        phase = self.phase
        self.phase, self._deadline = Phase.IDLE, None
        self._expired_callback(phase)

class Application(Protocol):
    """What a connection hands its requests to (app.py's `HttpApp`)."""

    max_input_size: int

    async def handle(self, request: HttpRequest) -> Answer:
        """The response to `request`; raises only CancelledError."""

    def log_access(self, request: HttpRequest | None, status: int, seconds: float, peer: str) -> None:
        """One access line (at --log-verbose 1); `request` None for a head that was not understood."""


@dataclass(frozen=True)
class ConnectionSettings:
    """What every connection of one listener shares."""

    app: Application
    timeouts: ReadTimeouts
    heap: HeapTrimmer
    opened: Callable[[HttpConnection], None]
    closed: Callable[[HttpConnection], None]


class _BadHead(Exception):
    """A head the limits refuse (raised in a parser callback; the parser then stops)."""


class _Malformed:
    """A head the parser refused: answered with 400 when its turn comes, then the connection closes."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class HttpConnection(asyncio.Protocol):
    """The protocol of one client connection."""

    def __init__(self, settings: ConnectionSettings) -> None:
        self._settings = settings
        self._app = settings.app
        self._loop = asyncio.get_event_loop()
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self._parser = httptools.HttpRequestParser(self)
        self._deadlines = ReadDeadlines(self._loop, settings.timeouts, self._expired)
        self._queue: collections.deque[HttpRequest | _Malformed] = collections.deque()
        self._active: asyncio.Task[None] | None = None
        self._active_request: HttpRequest | None = None  # the one `_active` serves
        self._receiving: HttpRequest | None = None  # head parsed, body still coming
        self._in_head = False
        self._heads = 0  # heads begun: a new one restarts the head deadline ...
        self._deadline_head = 1  # ... but the first one's counts from the connection
        self._url: list[bytes] = []
        self._url_size = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0  # bytes received since a head line last completed (the memory guard)
        self._fields = 0  # header lines complete when the last read ended
        self._raw_body = 0  # body bytes to pass by hand after an upgrade head (llhttp stops there)
        self._closing = False  # no request after the current ones: the connection closes then
        self._read_paused = False
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._carried = 0  # bytes received over the connection's life
        self._served = 0  # requests answered: the keep-alive timer looks whether it moved
        self._keep_alive: asyncio.TimerHandle | None = None
        # Called once when the connection drops (http/client_link.py registers here, so a request
        # learns at once that its client left; a handler is not cancelled by the connection).
        self.lost_callbacks: dict[object, Callable[[], None]] = {}

    # -- the transport's side ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, (list, tuple)) else str(peer or "")
        self._deadlines.head()  # an idle new connection is a head that never comes
        self._settings.opened(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.transport = None
        self._deadlines.cancel()
        if self._keep_alive is not None:
            self._keep_alive.cancel()
            self._keep_alive = None
        self._queue.clear()
        if self._receiving is not None:
            self._receiving.fail(ConnectionResetError("Connection lost"))
            self._receiving = None
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)  # drain() then raises: the client is gone
        request = self._active_request
        if request is not None:  # the request is its own client link (messages.py)
            request.client_gone()
            if request.cancel_on_loss and self._active is not None:
                self._active.cancel()  # an inference: cancelled down to the model (is_cancelled())
        callbacks, self.lost_callbacks = self.lost_callbacks, {}
        for callback in callbacks.values():
            callback()
        if self._carried >= TRIM_AFTER_BYTES:
            self._settings.heap.released()
        self._settings.closed(self)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return  # after a request that closes the connection, or a malformed one: not read
        self._carried += len(data)
        if self._raw_body:
            data = self._pass_raw_body(data)
            if not data:
                self._after_data(0)
                return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self._upgraded(data[upgrade.args[0]:])
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            self._malformed(str(cause) if isinstance(cause, _BadHead) else "Invalid request")
        except httptools.HttpParserError as exc:
            self._malformed(_reason(exc, data))
        self._after_data(len(data))

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        if self._active is None:
            self._next()

    # -- the parser's callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_head = True
        self._heads += 1
        self._url = []
        self._url_size = 0
        self._headers = []

    def on_url(self, part: bytes) -> None:
        self._url.append(part)
        self._url_size += len(part)
        if self._url_size > MAX_LINE:
            raise _BadHead(f"Got more than {MAX_LINE} bytes when reading: {b''.join(self._url)[:100]!r}...")

    def on_header(self, name: bytes, value: bytes) -> None:
        # The count is checked after each read (_after_data) and with the head: one call less here.
        if len(name) + len(value) > MAX_FIELD:
            raise _BadHead(f"Got more than {MAX_FIELD} bytes when reading: {(name + b': ' + value)[:100]!r}...")
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = self._fields = 0
        if len(self._headers) > MAX_HEADERS:
            raise _BadHead("Too many headers received")
        parser = self._parser
        method = parser.get_method().decode("latin-1")
        version = _VERSIONS.get(parser.get_http_version()) or _version(parser.get_http_version())
        headers = _headers(self._headers)
        if version >= (1, 1) and "Host" not in headers:
            raise _BadHead("Missing 'Host' header in request.")
        url = b"".join(self._url).decode("utf-8", "surrogateescape")
        if url[:1] == "/" and "%" not in url and "?" not in url and "#" not in url:
            target = (url, url, url)  # a plain path (every inference): split_target would change nothing
        else:
            try:
                target = split_target(method, url)
            except InvalidTarget as exc:
                raise _BadHead(f"Invalid URL: {exc}") from None
        length = headers.get("Content-Length")
        chunked = "chunked" in headers.get("Transfer-Encoding", "").lower()
        request = HttpRequest(self, method, target, version, headers, parser.should_keep_alive(),
                              int(length) if length else None, chunked, self._app.max_input_size)
        self._receiving = request
        self._queue.append(request)

    def on_body(self, chunk: bytes) -> None:
        receiving = self._receiving
        if receiving is None:
            return
        if receiving.waiter is None and not receiving.discarding:  # HttpRequest.feed when no reader waits
            receiving.chunks.append(chunk)
            receiving.size += len(chunk)
        else:
            receiving.feed(chunk)

    def on_message_complete(self) -> None:
        receiving = self._receiving
        if receiving is None:
            return
        if receiving.waiter is None:  # HttpRequest.finish when no reader waits
            receiving.complete = True
        else:
            receiving.finish()
        self._receiving = None

    # -- what requests and responses call ----------------------------------------------------------

    def send(self, data: bytes | bytearray | memoryview) -> None:
        """Write `data` (dropped once the client is gone: the reader of a response learns it from
        drain)."""
        if self.transport is not None:
            self.transport.write(data)

    async def drain(self) -> None:
        """Wait while the client's connection is full. Raises ConnectionResetError once it is gone."""
        if self._write_paused and self.transport is not None:
            self._drained = self._loop.create_future()
            try:
                await self._drained
            finally:
                self._drained = None
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("Connection lost")

    def send_head(self, request: HttpRequest, status: int, headers: Mapping[str, str], reason: str | None) -> None:
        """A streamed response's head (its headers may be relayed from elsewhere: checked)."""
        self.send(encode_head(request.status_version, status, headers, _connection_header(request), reason,
                              relayed=True))

    def send_response(self, request: HttpRequest, response: Response) -> None:
        """Write a whole response at once (a handler may, to time its sending; else the connection does)."""
        response.sent = True
        head = encode_head(request.status_version, response.status, response.headers, _connection_header(request))
        body = response.body
        if request.method == "HEAD" or not body:
            self.send(head)
        elif len(body) <= _SMALL_BODY:
            self.send(head + body)
        else:
            self.send(head)
            self.send(body)

    def body_wanted(self) -> None:
        """A reader waits for the whole body: it must keep arriving."""
        self._resume_if_drained()

    def body_taken(self) -> None:
        self._resume_if_drained()

    # -- the requests, one at a time ---------------------------------------------------------------

    def _after_data(self, size: int) -> None:
        deadlines = self._deadlines
        if self._in_head:
            fields = len(self._headers)
            self._head_bytes = size if fields != self._fields else self._head_bytes + size
            self._fields = fields
            if fields > MAX_HEADERS:
                self._malformed("Too many headers received")
            elif self._head_bytes > MAX_INCOMPLETE_FIELD:
                self._malformed(f"Got more than {MAX_FIELD} bytes when reading a header line that does not end")
            elif deadlines.phase is not Phase.HEAD or self._deadline_head != self._heads:
                self._deadline_head = self._heads
                deadlines.head()
        elif self._receiving is not None:
            if deadlines.phase is not Phase.BODY:
                deadlines.body()
            else:
                deadlines.body_received += size
        elif deadlines.phase is not Phase.IDLE:
            deadlines.idle()
        if self._active is None:
            self._next()
        self._pause_if_full()

    def _next(self) -> None:
        """Start the next queued request, unless one runs or the client does not read."""
        if self._write_paused or not self._queue or self.transport is None:
            return
        item = self._queue[0]
        if isinstance(item, HttpRequest) and not item.complete and item.content_length is not None \
                and item.content_length <= _SMALL_BODY and "Expect" not in item.headers:
            return  # the rest of a small body is on its way: the handler starts when it is in (no wait)
        self._queue.popleft()
        if isinstance(item, _Malformed):
            self._answer_malformed(item)
            return
        self._active_request = item
        self._active = self._loop.create_task(self._serve(item))
        self._resume_if_drained()

    async def _serve(self, request: HttpRequest) -> None:
        """One request's task: the app's answer, written; then the next request."""
        # log.verbose(1), read here directly: no access line, no clock read
        started = self._loop.time() if log_settings.log_verbose_level >= 1 else None
        keep_alive = False
        try:
            answer = await self._app.handle(request)
            try:
                if isinstance(answer, Response):
                    if not answer.sent:
                        self.send_response(request, answer)
                    keep_alive = request.keep_alive
                else:
                    keep_alive = await self._end_stream(request, answer)
            finally:
                if started is not None:
                    self._app.log_access(request, answer.status, self._loop.time() - started, self.peer)
        except (asyncio.CancelledError, ConnectionError):  # the client left (its inference was cancelled), or shutdown
            pass
        except Exception:  # the app answers every failure itself: a bug, so the connection closes
            _log.exception("HTTP %s %s: no answer could be made", request.method, request.path)
        finally:
            self._done(request, keep_alive)

    @staticmethod
    async def _end_stream(request: HttpRequest, answer: StreamResponse) -> bool:
        """Finish a streamed answer; whether the connection may serve another request."""
        if not answer.prepared:
            await answer.prepare(request)
            await answer.write_eof()
        elif not answer.finished:  # a stream that broke off: its end cannot be told
            return False
        return request.keep_alive

    def _done(self, request: HttpRequest, keep_alive: bool) -> None:
        self._active = None
        self._active_request = None
        request.watchers = None  # HttpRequest.detach: answered, its watchers go unheard
        if not request.complete:
            request.discard()  # the rest of its body is read and dropped (deadlines still apply)
        if not keep_alive:
            self._close()
        elif self._queue:
            self._next()  # (a malformed head queued behind it is answered there)
        elif self._closing:
            self._close()
        self._served += 1
        if self._keep_alive is None and not self._closing:
            self._keep_alive = self._loop.call_later(KEEP_ALIVE_SECONDS, self._check_keep_alive, self._served)
        self._resume_if_drained()

    def _check_keep_alive(self, served: int) -> None:
        """Close a connection that served nothing and waited for nothing for KEEP_ALIVE_SECONDS
        (one timer for all its requests: it looks whether one came since it was armed)."""
        self._keep_alive = None
        if served == self._served and self._active is None and not self._queue and not self._in_head \
                and self._receiving is None:
            _log.debug("closing an HTTP connection idle for %g s", KEEP_ALIVE_SECONDS)
            self._close()
        elif not self._closing:
            self._keep_alive = self._loop.call_later(KEEP_ALIVE_SECONDS, self._check_keep_alive, self._served)

    def _close(self) -> None:
        self._closing = True
        self._queue.clear()
        self._deadlines.cancel()
        if self._keep_alive is not None:
            self._keep_alive.cancel()
            self._keep_alive = None
        if self.transport is not None:
            self.transport.close()  # after what is buffered is sent

    # -- flow control ------------------------------------------------------------------------------

    def _pause_if_full(self) -> None:
        if self._read_paused or self.transport is None:
            return
        receiving = self._receiving
        if len(self._queue) >= MAX_QUEUED or (receiving is not None and receiving.unread > HIGH_WATER):
            self._read_paused = True
            self.transport.pause_reading()

    def _resume_if_drained(self) -> None:
        if not self._read_paused or self.transport is None:
            return
        receiving = self._receiving
        if len(self._queue) < MAX_QUEUED and (receiving is None or receiving.unread <= HIGH_WATER):
            self._read_paused = False
            self.transport.resume_reading()

    # -- heads that are not served -----------------------------------------------------------------

    def _malformed(self, reason: str) -> None:
        """Stop reading; answer 400 after the responses of the requests before it."""
        if self._closing:
            return
        self._closing = True
        self._in_head = False
        self._deadlines.cancel()
        if self._receiving is not None:  # its head was fine; its body is cut short
            self._receiving.fail(ConnectionResetError("malformed request body"))
            self._queue = collections.deque(item for item in self._queue if item is not self._receiving)
            self._receiving = None
        self._queue.append(_Malformed(reason))
        if self._active is None:
            self._next()

    def _answer_malformed(self, item: _Malformed) -> None:
        _client_log.debug("malformed HTTP request from %s: %s", self.peer, item.reason)
        response = text_response(item.reason, status=400)
        self.send(encode_head("HTTP/1.0", 400, response.headers, None) + response.body)
        if verbose(1):
            self._app.log_access(None, 400, 0.0, self.peer)
        self._close()

    def _upgraded(self, rest: bytes) -> None:
        """llhttp stops after the head of an `Upgrade` (or CONNECT) request; no route upgrades, so
        the request is served as any other and parsing goes on with a new parser after its body."""
        request = self._queue[-1] if self._queue else None
        self._parser = httptools.HttpRequestParser(self)
        if isinstance(request, HttpRequest) and request.body_exists:
            if request.chunked:
                self._malformed("an upgrade request with a chunked body")
                return
            self._receiving = request
            self._raw_body = request.content_length or 0
            request.reopen_body()  # llhttp reported its end with the head
        if rest:
            self.data_received(rest)

    def _pass_raw_body(self, data: bytes) -> bytes:
        """Feed up to the remaining raw body bytes to the receiving request; what follows them."""
        take = min(self._raw_body, len(data))
        receiving = self._receiving
        if receiving is not None and take:
            receiving.feed(data[:take])
        self._raw_body -= take
        if not self._raw_body and receiving is not None:
            receiving.finish()
            self._receiving = None
        return data[take:]

    def _expired(self, phase: Phase) -> None:
        _log.debug("closing an HTTP connection: the request %s did not arrive in time", phase.value)
        self._closing = True
        if self.transport is not None:
            self.transport.close()

    # -- the listener's side -----------------------------------------------------------------------

    def close_if_idle(self) -> bool:
        """Close now when no request is in progress; whether it was idle."""
        if self._active is None and not self._queue:
            self._close()
            return True
        return False

    def finish_then_close(self) -> asyncio.Task[None] | None:
        """Serve no request after the one in progress (returned, to be awaited), then close."""
        self._closing = True
        self._queue.clear()
        if self._active is None:
            self._close()
        return self._active

    def force_close(self) -> None:
        """Close (after what is buffered is sent), cancelling a request still in progress."""
        if self._active is not None:
            self._active.cancel()
        self._close()


def _headers(raw: list[tuple[bytes, bytes]]) -> CIMultiDictProxy[str]:
    """The headers as text (values as aiohttp read them: UTF-8, trailing blanks cut). Raises
    _BadHead for a header that may come once coming twice."""
    headers = CIMultiDict([(name.decode("latin-1"), value.rstrip(b" \t").decode("utf-8", "surrogateescape"))
                           for name, value in raw])
    if len({name.lower() for name, _ in raw}) < len(raw):  # some name twice
        for name in _SINGLETONS:
            if len(headers.getall(name, ())) > 1:
                raise _BadHead(f"Duplicate '{name}' header found.")
    return CIMultiDictProxy(headers)


def _reason(error: httptools.HttpParserError, data: bytes) -> str:
    """The parser's reason for refusing a head (aiohttp's text for TLS sent to the plain port)."""
    if isinstance(error, httptools.HttpParserInvalidMethodError) and data.startswith(b"\x16\x03"):
        return "Received HTTPS traffic on an HTTP port"
    return str(error.args[0]) if error.args else "Invalid request"


def _version(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def _connection_header(request: HttpRequest) -> str | None:
    """The `Connection` header a response needs: HTTP/1.1 keeps alive unless told, 1.0 closes."""
    if request.version >= (1, 1):
        return None if request.keep_alive else "close"
    return "keep-alive" if request.keep_alive else None
