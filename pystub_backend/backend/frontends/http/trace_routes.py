"""The trace extension's HTTP routes (the settings themselves: frontends/trace_settings.py).

    GET  /v2/trace/setting                  -> the global settings
    POST /v2/trace/setting                  {"trace_rate": "10", "trace_level": ["TIMESTAMPS"], ...}
    GET  /v2/models/{m}/trace/setting       -> the settings in force for model m
    POST /v2/models/{m}/trace/setting       a model's own settings (null clears one)
"""

from __future__ import annotations

import json

from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.frontends.http.app import compact_json
from pystub_backend.backend.frontends.http.messages import HttpRequest, Response
from pystub_backend.backend.frontends.http.router import Route
from pystub_backend.backend.frontends.trace_settings import UpdateGuard, trace_settings
from pystub_backend.backend.inference import FrontendCore
from pystub_backend.backend.telemetry.tracing import Tracer

__all__ = ["trace_routes"]


def _body(raw: bytes) -> dict[str, object]:
    if not raw.strip():
        return {}
    try:
        document = json.loads(raw)
    except ValueError as exc:
        raise ServerError(f"failed to parse the request JSON buffer: {exc}", Status.INVALID_ARG) from None
    if not isinstance(document, dict):
        raise ServerError("the request body must be a JSON object", Status.INVALID_ARG)
    return document


def trace_routes(tracer: Tracer, core: FrontendCore, guard: UpdateGuard | None = None) -> list[Route]:
    """The routes, bound to `tracer` and `core`; `guard` may refuse an update (ServerError)."""

    async def get(request: HttpRequest) -> Response:
        return compact_json(trace_settings(tracer, core, request.match_info.get("model", "")))

    async def post(request: HttpRequest) -> Response:
        update = _body(await request.read())
        if guard is not None:
            await guard(dict(request.headers))
        return compact_json(trace_settings(tracer, core, request.match_info.get("model", ""), update))

    return [Route(method, path, get if method == "GET" else post) for path in ("/v2/trace/setting",
            "/v2/models/{model}/trace/setting") for method in ("GET", "POST")]
