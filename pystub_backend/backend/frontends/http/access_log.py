"""aiohttp's access-log hook: one line per HTTP request at `--log-verbose 1` (frontends.access_log)."""

from __future__ import annotations

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, StreamResponse

from pystub_backend.backend.frontends.access_log import access_line
from pystub_backend.backend.frontends.http.client_errors import MALFORMED_KEY
from pystub_backend.backend.log import verbose

__all__ = ["HttpAccessLogger", "REQUEST_ID_KEY", "PEER_KEY", "MODEL_KEY"]

REQUEST_ID_KEY = web.RequestKey("pystub_request_id", str)  # where the infer handler leaves the request's id
PEER_KEY = web.RequestKey("pystub_peer", str)  # the client's address behind a frontend worker
MODEL_KEY = web.RequestKey("pystub_model", str)  # a model named in the body (the OpenAI port), not the path


class HttpAccessLogger(AbstractAccessLogger):
    """`AppRunner(access_log_class=HttpAccessLogger)`: always enabled for aiohttp (which reads
    `enabled` once per connection), so the level is checked here, per request."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        if not verbose(1):
            return
        peer = request.get(PEER_KEY) or request.remote or ""
        if request.get(MALFORMED_KEY):  # never parsed, never routed: nothing of it to name
            access_line("HTTP", "- -", str(response.status), time, peer, "", "")
            return
        match_info = getattr(request, "match_info", None)
        model = match_info.get("model", "") if match_info is not None else ""
        model = model or request.get(MODEL_KEY, "")
        access_line("HTTP", f"{request.method} {request.path}", str(response.status), time, peer,
                    model, request.get(REQUEST_ID_KEY, ""))
