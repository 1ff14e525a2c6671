"""The OpenAI-compatible API on a port of its own (`--openai-port`):

    GET  /v1/models               the ready models (as Triton's OpenAI frontend lists them)
    GET  /v1/models/{model}       one of them (404 when it is not served)
    POST /v1/completions          prompts, whole or streamed (generation.py)
    POST /v1/chat/completions     messages through the chat template (chat_template.py), same
    POST /v1/embeddings           embeddings.py

Each path is served with a trailing slash too. Every route belongs to the API group "openai":
`--http-restricted-api openai:<key>=<value>` makes its requests carry that header (for instance
`authorization=Bearer <token>`, which the `openai` client sends as its API key); without it, or
with another value, the answer is OpenAI's 401. None of them changes the server's state. Requests
appear in the access log (`--log-verbose 1`) as HTTP lines with their model and id, are traced
(continuing a `traceparent`), and are counted per model (telemetry/token_latency.py). Browsers may
call from the `--openai-cors-origin` origins (cors.py).
"""

from __future__ import annotations

import re
import time

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from pystub_backend.backend.frontends.access import AccessPolicy
from pystub_backend.backend.frontends.openai.cors import cors
from pystub_backend.backend.frontends.openai.documents import model_object
from pystub_backend.backend.frontends.openai.embeddings import embeddings
from pystub_backend.backend.frontends.openai.errors import OpenAIError, error_middleware, error_response
from pystub_backend.backend.frontends.openai.generation import CHAT, COMPLETIONS, Generation
from pystub_backend.backend.frontends.openai.request_body import chat_request, completion_request, parse_body
from pystub_backend.backend.frontends.openai.serving import OpenAIServing
from pystub_backend.backend.inference import FrontendCore
from pystub_backend.backend.options import Restrictions
from pystub_backend.backend.telemetry.token_latency import token_metrics_for
from pystub_backend.backend.telemetry.tracing import Tracer

__all__ = ["create_openai_app", "GROUP"]

GROUP = "openai"
_ROUTES = re.compile(r"/v1/(?:models(?:/[^/]+)?|completions|chat/completions|embeddings)/?")


def create_openai_app(core: FrontendCore, serving: OpenAIServing, *, max_input_size: int = 64 * 2**20,
                      restrictions: Restrictions | None = None, tracer: Tracer | None = None) -> web.Application:
    """The application of the OpenAI port, set up as `serving` says."""
    policy = AccessPolicy.of(restrictions)
    app = web.Application(client_max_size=max_input_size)
    preflight = cors(app, serving.cors_origins)
    app.middlewares.extend([*([preflight] if preflight else []), error_middleware, _restriction(policy)])
    routes = _Routes(core, serving, tracer or Tracer())
    for path, method, handler in (("/v1/models", "GET", routes.models), ("/v1/models/{model}", "GET", routes.model),
                                  ("/v1/completions", "POST", routes.completions),
                                  ("/v1/chat/completions", "POST", routes.chat),
                                  ("/v1/embeddings", "POST", routes.embeddings)):
        app.router.add_route(method, path, handler)
        app.router.add_route(method, path + "/", handler)
    return app


def _restriction(policy: AccessPolicy) -> Middleware:
    """The group's header check, answered as OpenAI answers a missing or wrong API key."""
    restriction = policy.restrictions.get(GROUP)

    @web.middleware
    async def restrict(request: web.Request, handler: Handler) -> web.StreamResponse:
        if restriction is None or not _ROUTES.fullmatch(request.path):
            return await handler(request)
        given = request.headers.get(restriction.key)
        if given == restriction.value:
            return await handler(request)
        what = "no" if given is None else "an incorrect"
        return error_response(OpenAIError(401, f"This API is restricted: the request has {what} '{restriction.key}' "
                                               "header (the API key)", code="invalid_api_key"))

    return restrict


class _Routes:
    def __init__(self, core: FrontendCore, serving: OpenAIServing, tracer: Tracer) -> None:
        self._core = core
        self._serving = serving
        self._metrics = token_metrics_for(core)
        self._generation = Generation(core, tracer, self._metrics, serving)

    def _served(self) -> list[str]:
        return sorted({entry["name"] for entry in self._core.repository_index(ready_only=True)})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [model_object(name) for name in self._served()]})

    async def model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name not in self._served():
            raise OpenAIError(404, f"The model '{name}' does not exist", "model", "model_not_found")
        return web.json_response(model_object(name))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        received = time.monotonic()  # the time to first token counts from here
        generation = completion_request(parse_body(await request.read()))
        return await self._generation.serve(request, generation, COMPLETIONS, received)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        received = time.monotonic()
        generation = chat_request(parse_body(await request.read()), self._serving.template.render)
        return await self._generation.serve(request, generation, CHAT, received)

    async def embeddings(self, request: web.Request) -> web.Response:
        return await embeddings(self._core, self._metrics, self._serving.counter, request,
                                parse_body(await request.read()))
