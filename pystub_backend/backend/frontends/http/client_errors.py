"""Malformed requests are the client's mistake, not the server's: no traceback in the log.

aiohttp answers a request head it cannot parse (a bare CR, a NUL, a header line past its limit)
with a 400, but logs it through `logger.exception` (an 11-line traceback, as plain text whatever
--log-format says), and the access logger then meets a request that was never routed.
`QuietClientErrors.handle_error` answers such a request the same way and logs one debug line
instead; the request is marked (`MALFORMED_KEY`) so that the access line says `-` for what was
not understood. Errors of the server's own handlers (a 500) keep their traceback.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

__all__ = ["QuietClientErrors", "MALFORMED_KEY"]

log = logging.getLogger("pystub.http")

MALFORMED_KEY = web.RequestKey("pystub_malformed", bool)


class QuietClientErrors(RequestHandler):
    """aiohttp's connection protocol answering malformed requests without a traceback."""

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        log.debug("malformed HTTP request from %s: %s", request.remote, exc)
        request[MALFORMED_KEY] = True
        if request.writer.output_size > 0:  # as aiohttp: a response had begun, the connection is broken
            raise ConnectionError("Response is sent already, cannot send another response with the error message")
        response = web.Response(status=status, text=message or exc.message, content_type="text/plain")
        response.force_close()
        return response
