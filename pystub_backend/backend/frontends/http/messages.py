"""The HTTP messages of the listener's handlers: the request a handler reads and the response it
answers.

## The request

One HTTP request as the handlers of the HTTP listener see it: its head, parsed once by the
connection (connection.py), and its body, which the connection feeds in as it arrives.

    method, path (percent-decoded), path_safe (decoded but for %2F and %25: what routes match),
    raw_path_qs, version, headers (case-insensitive), keep_alive, remote (the peer's address),
    match_info (the route's variables), request_id (the access line's `id=`)

The body is read in one of three ways:

    complete_body()       the whole body when all of it has arrived already (small requests
                          arrive with their head), else None; never waits
    await read_body(n)    the whole body, refused with BodyTooLarge as soon as more than n bytes
                          came; `await read()` is read_body(the listener's --http-max-input-size)
    await readany()       what has arrived since the last call (b"" at the end): a relay streams
                          the body on with it, and the connection stops reading from the client
                          while more than `HIGH_WATER` bytes wait unread

A client that disconnects first makes a waiting read raise ConnectionResetError.

The paths are decoded as aiohttp (yarl) decoded them, so routes and model names are unchanged.

## The response

What a handler of the HTTP listener answers: a `Response` (a whole body, the common case) or a
`StreamResponse` (a body written as it is produced: generate_stream's events, the frontend
workers' relay), and how either becomes bytes on the wire.

    Response(body, status=200, headers=None, content_type=None)     json_response(value, ...)
        status line, the handler's headers, Content-Type (when there is a body or one was
        given), Content-Length, Date, and Connection when the request decides it
    StreamResponse: prepare(request) writes the head, write(data) a chunk, write_eof() the end;
        `Transfer-Encoding: chunked` unless a content length is set, or the request is HTTP/1.0
        (then the body ends when the connection closes)

The headers are those aiohttp, which served this port before, wrote (less its `Server` line), so
clients and tests see the same answers.
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
import time
from collections.abc import Callable, Hashable, Mapping
from email.utils import formatdate
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

if TYPE_CHECKING:
    from pystub_backend.backend.frontends.http.connection import HttpConnection

__all__ = ["HttpRequest", "BodyTooLarge", "InvalidTarget", "HIGH_WATER", "Answer", "Response", "StreamResponse",
           "json_response", "text_response", "encode_head", "CONTINUE"]


_log = logging.getLogger(__name__)

HIGH_WATER = 256 * 1024  # unread body bytes of a request that no reader waits for: stop reading
_NO_VARIABLES: Mapping[str, str] = MappingProxyType({})


class BodyTooLarge(Exception):
    """The body passed the limit its reader set."""


class InvalidTarget(ValueError):
    """The request target is neither a path, `*` (OPTIONS) nor an absolute URL with a host."""


def split_target(method: str, target: str) -> tuple[str, str, str]:
    """(path, path_safe, raw path with its query) of a request target, decoded as aiohttp's parser
    and yarl do. Raises InvalidTarget."""
    if target.startswith("/"):
        raw = target.partition("#")[0]
        path = raw.partition("?")[0]
        if "%" not in path:  # nothing to decode (yarl changes nothing else), the common case
            return path, path, raw
        url = URL.build(path=path, encoded=True)
        return url.path, url.path_safe, raw
    if target == "*" and method == "OPTIONS":
        return "*", "*", "*"
    try:
        url = URL(target, encoded=True)
    except ValueError:
        raise InvalidTarget(target) from None
    if not url.raw_host:
        raise InvalidTarget(target)
    return url.path, url.path_safe, url.raw_path_qs


class HttpRequest:
    """A request of one connection; built by the connection when its head is complete."""

    __slots__ = ("connection", "method", "path", "path_safe", "raw_path_qs", "version", "headers", "keep_alive",
                 "status_version",
                 "remote", "match_info", "request_id", "content_length", "chunked", "max_size",
                 "chunks", "size", "complete", "waiter", "_limit", "_error", "_wants_all", "discarding",
                 "closed", "cancel_on_loss", "watchers")

    def __init__(self, connection: HttpConnection, method: str, target: tuple[str, str, str],
                 version: tuple[int, int], headers: CIMultiDictProxy[str], keep_alive: bool,
                 content_length: int | None, chunked: bool, max_size: int) -> None:
        self.connection = connection
        self.method = method
        self.path, self.path_safe, self.raw_path_qs = target
        self.version = version
        self.status_version = "HTTP/1.1" if version == (1, 1) else f"HTTP/{version[0]}.{version[1]}"  # answers'
        self.headers = headers
        self.keep_alive = keep_alive
        self.remote: str = connection.peer
        self.match_info: Mapping[str, str] = _NO_VARIABLES
        self.request_id = ""
        self.content_length = content_length
        self.chunked = chunked
        self.max_size = max_size
        self.chunks: list[bytes] = []
        self.size = 0
        self.complete = not chunked and not content_length
        self.waiter: asyncio.Future[None] | None = None
        self._limit: int | None = None
        self._error: BaseException | None = None
        self._wants_all = False
        self.discarding = False
        # The request is its own client link (client_link.Link): no object of its own per request.
        self.closed = False  # its client is gone
        self.cancel_on_loss = False  # a handler that wants its task cancelled then (inference)
        self.watchers: dict[Hashable, Callable[[], object]] | None = None

    # -- what handlers use -------------------------------------------------------------------------

    @property
    def transport(self) -> asyncio.Transport | None:
        """The connection's transport; None once the client is gone."""
        return self.connection.transport

    @property
    def protocol(self) -> HttpConnection:
        return self.connection

    @property
    def body_exists(self) -> bool:
        return self.chunked or bool(self.content_length)

    def complete_body(self) -> bytes | None:
        """The whole body if it has all arrived, else None."""
        if not self.complete:
            return None
        chunks = self.chunks
        if len(chunks) == 1:
            return chunks[0]
        body = b"".join(chunks)
        self.chunks = [body] if body else []
        return body

    async def read_body(self, limit: int | None = None) -> bytes:
        """The whole body. Raises BodyTooLarge as soon as more than `limit` bytes arrived, and
        ConnectionResetError when the client leaves first."""
        self._wants_all = True
        self.connection.body_wanted()
        while not self.complete:
            if limit is not None and self.size > limit:
                raise BodyTooLarge(limit)
            self._limit = limit
            await self._wait()
        if limit is not None and self.size > limit:
            raise BodyTooLarge(limit)
        body = self.complete_body()
        assert body is not None
        return body

    async def read(self) -> bytes:
        """The whole body, at most `max_size` bytes (BodyTooLarge above)."""
        return await self.read_body(self.max_size)

    async def readany(self) -> bytes:
        """What arrived since the last call, waiting for something; b"" at the end of the body.
        Raises ConnectionResetError when the client leaves first."""
        while not self.chunks and not self.complete:
            await self._wait()
        chunks, self.chunks = self.chunks, []
        self.connection.body_taken()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None
        if self._error is not None:
            raise self._error

    # -- its client link (client_link.Link) ---------------------------------------------------------

    def watch(self, key: Hashable, callback: Callable[[], object]) -> None:
        """Call `callback()` when the client goes away while the request runs (now, if it has)."""
        if self.closed:
            callback()
            return
        if self.watchers is None:
            self.watchers = {}
        self.watchers[key] = callback

    def unwatch(self, key: Hashable) -> None:
        if self.watchers is not None:
            self.watchers.pop(key, None)

    def client_gone(self) -> None:
        """The connection dropped: the watchers hear it, once."""
        if self.closed:
            return
        self.closed = True
        watchers, self.watchers = self.watchers, None
        for callback in (watchers or {}).values():
            try:
                callback()
            except Exception:  # one watcher's bug must not keep the others from hearing it
                _log.exception("a client-link watcher failed")

    def detach(self) -> None:
        """The request was answered: its watchers are dropped unheard."""
        self.watchers = None

    # -- what the connection calls -----------------------------------------------------------------

    @property
    def unread(self) -> int:
        """Body bytes buffered that no reader waits for (the connection's reason to stop reading)."""
        return 0 if self._wants_all or self.discarding else sum(map(len, self.chunks))

    def feed(self, chunk: bytes) -> None:
        if self.discarding:
            return
        self.chunks.append(chunk)
        self.size += len(chunk)
        waiter = self.waiter
        if waiter is not None and not waiter.done() and (not self._wants_all or (
                self._limit is not None and self.size > self._limit)):
            waiter.set_result(None)

    def finish(self) -> None:
        self.complete = True
        self._wake()

    def fail(self, error: BaseException) -> None:
        """The connection dropped before the body ended."""
        if not self.complete:
            self._error = error
            self._wake()

    def reopen_body(self) -> None:
        """The parser called the body complete with the head (llhttp, for an upgrade request): the
        connection passes it by hand."""
        self.complete = False

    def discard(self) -> None:
        """The handler is done: the rest of the body is read and dropped."""
        self.discarding = True
        self.chunks = []

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


# -- the response ---------------------------------------------------------------------------------


JSON_TYPE = "application/json"  # exactly, as Triton sends it (aiohttp added "; charset=utf-8")
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_REASONS = {status.value: status.phrase for status in http.HTTPStatus}
_STATUS_LINES = {status: f" {status} {phrase}\r\n" for status, phrase in _REASONS.items()}  # after the version
_date = ["", -1.0]  # the Date header's text and the second it is for (formatting it costs 3 us)


def _http_date() -> str:
    now = time.time()
    if now - _date[1] >= 1.0 or now < _date[1]:  # type: ignore[operator]
        _date[0], _date[1] = formatdate(now, usegmt=True), float(int(now))
    return _date[0]  # type: ignore[return-value]


def reason_of(status: int) -> str:
    return _REASONS.get(status, "Unknown")


def encode_head(version: str, status: int, headers: Mapping[str, str], connection: str | None,
                reason: str | None = None, *, relayed: bool = False) -> bytes:
    """The status line and header block (ending in the blank line); `connection` is the value of a
    `Connection` header to add, if any. `relayed` headers (not the server's own) are checked:
    ValueError for a CR or LF in one (a response splitting attempt)."""
    parts = [version, _STATUS_LINES[status] if reason is None and status in _STATUS_LINES else
             f" {status} {reason or reason_of(status)}\r\n"]
    for name, value in headers.items():
        parts += (name, ": ", value, "\r\n")
    if relayed and any("\r" in part or "\n" in part for part in parts[2::4] + parts[4::4]):
        raise ValueError("a CR or LF in a response header")
    parts += ("Date: ", _http_date(), "\r\n\r\n" if connection is None else f"\r\nConnection: {connection}\r\n\r\n")
    return "".join(parts).encode("utf-8")


class Response:
    """A whole response. `headers` are sent as given, then Content-Type (`content_type`, else
    application/octet-stream for a body without one) and Content-Length."""

    __slots__ = ("status", "body", "headers", "sent")

    def __init__(self, body: bytes | bytearray | memoryview = b"", *, status: int = 200,
                 headers: Mapping[str, str] | None = None, content_type: str | None = None) -> None:
        self.status = status
        self.body = body
        fields = dict(headers) if headers else {}
        if content_type is not None:
            fields["Content-Type"] = content_type
        elif body and "Content-Type" not in fields:
            fields["Content-Type"] = "application/octet-stream"
        fields["Content-Length"] = str(len(body))
        self.headers = fields
        self.sent = False  # written already by the handler (to time its sending)


def json_response(value: Any, *, status: int = 200, headers: Mapping[str, str] | None = None,
                  dumps: Callable[[Any], str] = json.dumps) -> Response:
    """`value` as JSON (`Content-Type: application/json`, exactly as Triton says it)."""
    return Response(dumps(value).encode(), status=status, headers=headers, content_type=JSON_TYPE)


def text_response(text: str, *, status: int) -> Response:
    return Response(text.encode(), status=status, content_type="text/plain; charset=utf-8")


class StreamResponse:
    """A response whose body is written piece by piece (after `prepare`). `write` waits while the
    client's connection is full, and raises ConnectionResetError once the client is gone."""

    prepared = False

    def __init__(self, *, status: int = 200, reason: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        self.status = status
        self.reason = reason
        self.headers: CIMultiDict[str] = CIMultiDict(headers or {})
        self.content_length: int | None = None
        self._request: HttpRequest | None = None
        self._chunked = False
        self.finished = False

    async def prepare(self, request: HttpRequest) -> None:
        """Write the status line and headers. Raises ConnectionResetError when the client is gone."""
        if self.prepared:
            return
        self.prepared = True
        self._request = request
        headers = self.headers
        if self.content_length is not None:
            headers["Content-Length"] = str(self.content_length)
        elif request.version >= (1, 1):
            self._chunked = True
            headers["Transfer-Encoding"] = "chunked"
        else:
            request.keep_alive = False  # HTTP/1.0: the end of the body is the end of the connection
        request.connection.send_head(request, self.status, headers, self.reason)
        await request.connection.drain()

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Send `data` (nothing for an empty one). Raises ConnectionResetError when the client is gone."""
        request = self._request
        assert request is not None, "write before prepare"
        if not data:
            return
        if self._chunked:
            request.connection.send(b"%x\r\n" % len(data))
            request.connection.send(data)
            request.connection.send(b"\r\n")
        else:
            request.connection.send(data)
        await request.connection.drain()

    async def write_eof(self) -> None:
        request = self._request
        assert request is not None, "write_eof before prepare"
        if self.finished:
            return
        self.finished = True
        if self._chunked:
            request.connection.send(b"0\r\n\r\n")
        await request.connection.drain()


Answer = Response | StreamResponse  # what a handler returns
