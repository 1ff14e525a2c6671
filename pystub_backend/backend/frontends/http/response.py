"""What a handler of the HTTP listener answers: a `Response` (a whole body, the common case) or a
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

import http
import json
import time
from collections.abc import Callable, Mapping
from email.utils import formatdate
from typing import TYPE_CHECKING, Any

from multidict import CIMultiDict

if TYPE_CHECKING:
    from pystub_backend.backend.frontends.http.request import HttpRequest

__all__ = ["Answer", "Response", "StreamResponse", "json_response", "text_response", "encode_head", "CONTINUE"]

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
