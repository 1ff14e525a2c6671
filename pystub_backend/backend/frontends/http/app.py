"""The inference port's application: what a connection (connection.py) hands each request to.

    request ─► route (router.py; 404 / 405 later) ─► Expect: 100-continue answered
            ─► [front: the frontend workers' hook, may answer itself]
            ─► restricted-API key and access policy (restrict.py: 403)
            ─► the route's handler
    every error leaves as {"error": msg}: ServerError with its status, 404 "Not Found", 405 "Method
    Not Allowed" (with Allow), a body over --http-max-input-size 400, anything else 500 (logged
    with its traceback)

`trust_internal_peer` (only for the core's private socket behind frontend workers): the
`INTERNAL_PEER` header names the client's address, for the access policy and the access line.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable, Iterable

from pystub_backend.backend.errors import ServerError, forget_traceback, http_status
from pystub_backend.backend.frontends.access import INTERNAL_PEER, AccessPolicy
from pystub_backend.backend.frontends.access_log import access_line
from pystub_backend.backend.frontends.http.messages import (
    CONTINUE,
    Answer,
    BodyTooLarge,
    HttpRequest,
    Response,
    json_response,
    text_response,
)
from pystub_backend.backend.frontends.http.restrict import READ_METHODS, refusal_response
from pystub_backend.backend.frontends.http.router import Handler, Route, RouteMiss, Router
from pystub_backend.backend.log import verbose

__all__ = ["HttpApp", "Front", "error_response", "compact_json"]

_log = logging.getLogger(__name__)

# The frontend workers' hook: runs before the checks and the handler; calls `inner` or answers itself.
Front = Callable[[HttpRequest, Handler], Awaitable[Answer]]


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def compact_json(value: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """`value` as JSON without spaces (what the KServe routes answer)."""
    return json_response(value, status=status, headers=headers, dumps=_dumps)


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return compact_json({"error": message}, status, headers)


class HttpApp:
    """Routes and the checks before them; `handle` answers every request."""

    def __init__(self, routes: Iterable[Route], *, max_input_size: int, policy: AccessPolicy,
                 trust_internal_peer: bool = False, front: Front | None = None) -> None:
        self.router = Router(routes)
        self.max_input_size = max_input_size
        self._policy = policy
        self._restricted = bool(policy.restrictions)
        self._trust_internal_peer = trust_internal_peer
        self._front = front

    def add_routes(self, routes: Iterable[Route]) -> None:
        self.router.add_all(routes)

    async def handle(self, request: HttpRequest) -> Answer:
        """The answer to `request`; raises only CancelledError."""
        if self._trust_internal_peer:
            request.remote = request.headers.get(INTERNAL_PEER, request.remote)
        method = request.method
        found = self.router.cache.get((method, request.path_safe)) or self.router.resolve(method, request.path_safe)
        if request.headers.get("Expect"):
            refused = _expect(request)
            if refused is not None:
                return refused
        handler: Handler
        if isinstance(found, RouteMiss):
            handler = _miss_handler(found)
        else:
            handler, request.match_info = found
        if self._front is not None:
            try:
                return await self._front(request, functools.partial(self._checked, handler))
            except Exception as exc:  # noqa: BLE001 - the front's own failure still answers in JSON
                return _failure(request, exc)
        try:  # _checked, inline: one coroutine less on the way of every request
            if self._restricted or (method not in READ_METHODS and _may_change_state(request.path)):
                refusal = refusal_response(self._policy, request)
                if refusal is not None:
                    return refusal
            return await handler(request)
        except Exception as exc:  # noqa: BLE001 - any failure must still answer in JSON
            return _failure(request, exc)

    async def _checked(self, handler: Handler, request: HttpRequest) -> Answer:
        try:
            refusal = refusal_response(self._policy, request)
            return refusal if refusal is not None else await handler(request)
        except Exception as exc:  # noqa: BLE001 - any failure must still answer in JSON
            return _failure(request, exc)

    # -- the access log ----------------------------------------------------------------------------

    @staticmethod
    def log_access(request: HttpRequest | None, status: int, seconds: float, peer: str) -> None:
        if not verbose(1):
            return
        if request is None:  # never parsed, never routed: nothing of it to name
            access_line("HTTP", "- -", str(status), seconds, peer, "", "")
            return
        access_line("HTTP", f"{request.method} {request.path}", str(status), seconds, request.remote or "",
                    request.match_info.get("model", ""), request.request_id)


def _may_change_state(path: str) -> bool:
    """Whether a request that is not a read may change state (restrict.py decides): under
    /v2/models/ only trace settings do, so an inference skips the checks' call."""
    return not path.startswith("/v2/models/") or "/trace/setting" in path


def _failure(request: HttpRequest, exc: Exception) -> Response:
    """The JSON error a handler's exception answers."""
    if isinstance(exc, ServerError):
        forget_traceback(exc)  # it may live on in a response or stream its frames hold: a cycle
        return error_response(http_status(exc.status), exc.message)
    if isinstance(exc, BodyTooLarge):  # a handler's read(), bounded by --http-max-input-size
        return error_response(400, "request body exceeds the maximum input size")
    if isinstance(exc, ConnectionResetError):  # the client left, or was closed for reading too slowly
        _log.debug("HTTP %s %s: the connection closed before the request was read", request.method, request.path)
        return error_response(400, "the connection closed before the request was read")
    _log.exception("HTTP %s %s failed", request.method, request.path, exc_info=exc)
    forget_traceback(exc)
    return error_response(500, str(exc) or type(exc).__name__)


def _miss_handler(miss: RouteMiss) -> Handler:
    """A handler answering the 404 or 405 (after the restriction checks, as aiohttp's router did)."""
    async def missed(_: HttpRequest) -> Answer:
        if miss.status == 405:
            return error_response(405, "Method Not Allowed", {"Allow": ",".join(sorted(miss.allowed))})
        return error_response(404, "Not Found")

    return missed


def _expect(request: HttpRequest) -> Response | None:
    """`Expect: 100-continue` (HTTP/1.1): the interim 100 now; another expectation: 417."""
    if request.version < (1, 1):
        return None
    expect = request.headers.get("Expect", "")
    if expect.lower() == "100-continue":
        request.connection.send(CONTINUE)
        return None
    return text_response(f"Unknown Expect: {expect}", status=417)
