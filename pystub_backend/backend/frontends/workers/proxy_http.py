"""The HTTP reverse proxy of a frontend worker: every request the fast path does not serve goes to
the core's full HTTP application on its private unix socket, streamed both ways.

The client's address travels in `access.INTERNAL_PEER` (any copy the client sent is dropped first),
so the core's access policy, restrictions and access log judge the real client. Hop-by-hop headers
are not forwarded; the body is passed as sent (no decompression here: the core applies the limits).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from pystub_backend.backend.client_link import cancel_when_gone
from pystub_backend.backend.errors import ServerError, Status, http_status
from pystub_backend.backend.frontends.access import INTERNAL_PEER
from pystub_backend.backend.frontends.http.messages import HttpRequest, Response, StreamResponse, json_response
from pystub_backend.backend.frontends.http.request_link import http_request_link

__all__ = ["HttpProxy"]

_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                         "trailer", "transfer-encoding", "upgrade", "host", INTERNAL_PEER})
_CHUNK = 1 << 16


class HttpProxy:
    """Forwards requests to the core's HTTP app at the unix socket `path`. `close()` at the end."""

    def __init__(self, path: str) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=path, limit=0), auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30))

    async def close(self) -> None:
        await self._session.close()

    async def handle(self, request: HttpRequest) -> Response | StreamResponse:
        """The core's answer to `request` (503 when the core is unreachable)."""
        headers = CIMultiDict((key, value) for key, value in request.headers.items()
                              if key.lower() not in _HOP_BY_HOP)
        headers[INTERNAL_PEER] = request.remote or ""
        body = _body_of(request) if request.body_exists else None
        try:
            # A client that leaves (a quiet generate_stream) cancels this task at once: the core's
            # connection closes with it and the core cancels the request.
            with http_request_link(request) as link:
                cancel_when_gone(link)
                # encoded=True: the path as the client sent it, `.` and `..` included (yarl would
                # resolve them, and the core must route exactly what an in-process server would)
                async with self._session.request(request.method, URL("http://core" + request.raw_path_qs,
                                                                     encoded=True),
                                                 headers=headers, data=body, allow_redirects=False,
                                                 skip_auto_headers=("User-Agent", "Content-Type")) as answer:
                    return await _relay(request, answer)
        except aiohttp.ClientConnectionError as exc:
            # Before the app's error middleware (a raw infer body comes here from the front): answer here.
            error = ServerError(f"the server's core did not answer this frontend worker: {exc}", Status.UNAVAILABLE)
            return json_response({"error": error.message}, status=http_status(error.status))


async def _body_of(request: HttpRequest) -> AsyncIterator[bytes]:
    """The client's body as it arrives (the connection stops reading while it waits unread)."""
    while chunk := await request.readany():
        yield chunk


async def _relay(request: HttpRequest, answer: aiohttp.ClientResponse) -> StreamResponse:
    response = StreamResponse(status=answer.status, reason=answer.reason)
    for key, value in answer.headers.items():
        if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
            response.headers.add(key, value)
    if answer.content_length is not None:
        response.content_length = answer.content_length
    await response.prepare(request)
    async for chunk in answer.content.iter_chunked(_CHUNK):
        await response.write(chunk)
    await response.write_eof()
    return response
