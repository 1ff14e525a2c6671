"""Cross-origin calls from browsers (`--openai-cors-origin`): off unless origins are given.

A preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) from an allowed origin
is answered 204 with the methods and the headers it asked for, before the API key is checked
(browsers send no credentials on a preflight); from another origin, 403. Every other answer to an
allowed origin, a stream's included, carries `Access-Control-Allow-Origin` (the origin itself) and
`Vary: Origin`. `*` allows any origin.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from pystub_backend.backend.frontends.openai.errors import OpenAIError, error_response

__all__ = ["cors"]

_METHODS = "GET, POST, OPTIONS"
_HEADERS = "authorization, content-type, openai-organization, openai-project, x-stainless-lang"
_MAX_AGE = "600"


def _allowed(origins: tuple[str, ...], origin: str | None) -> bool:
    return origin is not None and ("*" in origins or origin in origins)


def cors(app: web.Application, origins: tuple[str, ...]) -> Middleware | None:
    """The preflight middleware (None without origins); registers the headers of every answer on `app`."""
    if not origins:
        return None

    async def allow_origin(request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if _allowed(origins, origin):
            assert origin is not None
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Vary"] = "Origin"

    app.on_response_prepare.append(allow_origin)

    @web.middleware
    async def preflight(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "OPTIONS" or "Access-Control-Request-Method" not in request.headers:
            return await handler(request)
        if not _allowed(origins, request.headers.get("Origin")):
            return error_response(OpenAIError(403, f"origin {request.headers.get('Origin')!r} is not allowed "
                                                   "(--openai-cors-origin)"))
        return web.Response(status=204, headers={
            "Access-Control-Allow-Methods": _METHODS, "Access-Control-Max-Age": _MAX_AGE,
            "Access-Control-Allow-Headers": request.headers.get("Access-Control-Request-Headers", _HEADERS)})

    return preflight
