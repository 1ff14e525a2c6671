"""HTTP routes of the shared memory extensions (docs/reference/protocol.md#http-routes,
#system-shared-memory-extension).

    GET  /v2/systemsharedmemory[/region/{r}]/status    -> [{"name", "key", "offset", "byte_size"}]
    POST /v2/systemsharedmemory/region/{r}/register    {"key", "offset", "byte_size"}
    POST /v2/systemsharedmemory[/region/{r}]/unregister   (no region: all)
    GET  /v2/cudasharedmemory[/region/{r}]/status      -> [{"name", "device_id", "byte_size"}]
    POST /v2/cudasharedmemory/region/{r}/register      {"raw_handle": {"b64"}, "device_id", "byte_size"}
                                                          (refused without a GPU, after Triton's body checks)
    POST /v2/cudasharedmemory[/region/{r}]/unregister   (no region: all)

The calls go to the core's `pystub_backend.backend.features.client_shm.ClientShmRegistry`; errors
are `ServerError`s that the app's error middleware renders as `{"error": msg}`.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.frontends.http.app import compact_json
from pystub_backend.backend.frontends.http.json_body import parse_json_body
from pystub_backend.backend.frontends.http.messages import HttpRequest, Response
from pystub_backend.backend.frontends.http.router import Route, get, post

__all__ = ["shm_routes"]

_SYSTEM = "/v2/systemsharedmemory"
_CUDA = "/v2/cudasharedmemory"


def _register_body(body: bytes) -> dict[str, Any]:
    document = parse_json_body(body) if body.strip() else None
    if not isinstance(document, dict):
        raise ServerError("the register request must be a JSON object", Status.INVALID_ARG)
    return document


def _check_cuda_register_body(body: bytes) -> tuple[bytes, Any, Any]:
    """(raw handle, device_id, byte_size) of a CUDA register body, after Triton's checks in its
    order and with its texts (the JSON reader's for a missing member). Raises ServerError."""
    document = _register_body(body)
    if "raw_handle" not in document:
        raise ServerError("Shared memory register request has no 'raw_handle' field", Status.INVALID_ARG)
    if not isinstance(document["raw_handle"], dict) or "b64" not in document["raw_handle"]:
        raise ServerError("attempt to access non-existing object member 'b64'", Status.INTERNAL)
    try:
        raw_handle = base64.b64decode(str(document["raw_handle"]["b64"]), validate=True)
    except (binascii.Error, ValueError):
        raise ServerError("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t", Status.INVALID_ARG) \
            from None
    for member in ("byte_size", "device_id"):
        if member not in document:
            raise ServerError(f"attempt to access non-existing object member '{member}'", Status.INTERNAL)
    return raw_handle, document["device_id"], document["byte_size"]


def shm_routes(core: Any) -> list[Route]:
    """The routes, bound to `core` (a `pystub_backend.backend.core.Core`, whose `client_shm` does the work)."""
    registry = core.client_shm

    def region(request: HttpRequest) -> str:
        return request.match_info.get("region", "")

    async def system_status(request: HttpRequest) -> Response:
        return compact_json(registry.status(region(request)))

    async def system_register(request: HttpRequest) -> Response:
        body = _register_body(await request.read())
        registry.register(region(request), body.get("key"), body.get("offset", 0), body.get("byte_size"))
        return Response(status=200)

    async def system_unregister(request: HttpRequest) -> Response:
        registry.unregister(region(request))
        return Response(status=200)

    async def cuda_status(request: HttpRequest) -> Response:
        return compact_json(registry.cuda_status(region(request)))

    async def cuda_register(request: HttpRequest) -> Response:
        raw_handle, device_id, byte_size = _check_cuda_register_body(await request.read())
        registry.cuda_register(region(request), raw_handle, device_id, byte_size)
        return Response(status=200)

    async def cuda_unregister(request: HttpRequest) -> Response:
        await registry.cuda_unregister_closed(region(request))  # the stubs closed their handles
        return Response(status=200)

    routes: list[Route] = []
    for prefix, status, register, unregister in ((_SYSTEM, system_status, system_register, system_unregister),
                                                 (_CUDA, cuda_status, cuda_register, cuda_unregister)):
        routes += [
            get(prefix + "/status", status),
            get(prefix + "/region/{region}/status", status),
            post(prefix + "/region/{region}/register", register),
            post(prefix + "/unregister", unregister),
            post(prefix + "/region/{region}/unregister", unregister),
        ]
    return routes
