"""HTTP routes of the model repository (load/unload) and logging extensions
(docs/reference/protocol.md#http-routes, #logging-extension, #model-repository-extension).

    POST /v2/repository/models/{m}/load     {"parameters": {"config": "<json>", "file:1/model.py": "<base64>"}}
    POST /v2/repository/models/{m}/unload   {"parameters": {"unload_dependents": bool}}
    GET  /v2/logging                        -> every log setting
    POST /v2/logging                        {"log_info": false, ...} -> every log setting

Errors are `ServerError`s; the app's error middleware renders them as `{"error": msg}`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Any

from pystub_backend.backend import log as backend_log
from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.frontends.http.app import compact_json
from pystub_backend.backend.frontends.http.json_body import parse_json_body, parse_json_body_off_loop
from pystub_backend.backend.frontends.http.messages import HttpRequest, Response
from pystub_backend.backend.frontends.http.router import Route, get, post
from pystub_backend.backend.inference import FrontendCore
from pystub_backend.backend.models.overrides import FILE_PREFIX, check_override_count

__all__ = ["control_routes"]


# A load body above this is parsed and decoded off the event loop (`_load_parameters`).
_OFF_LOOP_BYTES = 1 << 18
_B64_CHUNK = 1 << 18  # characters, a multiple of 4: about 1 ms of decoding per step


def _invalid(message: str) -> ServerError:
    return ServerError(message, Status.INVALID_ARG)


def _document(body: bytes) -> dict[str, Any]:
    """The body's JSON object; an empty body is `{}`."""
    return _object(parse_json_body(body) if body.strip() else {})


def _object(document: object) -> dict[str, Any]:
    if not isinstance(document, dict):
        raise _invalid("the request body must be a JSON object")
    return document


def _parameters(body: bytes) -> dict[str, Any]:
    return _parameters_of(_document(body))


def _parameters_of(document: dict[str, Any]) -> dict[str, Any]:
    parameters = document.get("parameters", {})
    if not isinstance(parameters, dict):
        raise _invalid("'parameters' must be a JSON object")
    return parameters


def load_parameters(body: bytes) -> dict[str, Any]:
    """The load request's parameters, with `file:` contents base64-decoded to bytes."""
    return _decode_files(_parameters(body))


async def _load_parameters(body: bytes) -> dict[str, Any]:
    """`load_parameters`; a large body (override files) is parsed and decoded in a worker thread,
    in steps that each hold the interpreter lock briefly, so health probes keep answering."""
    if len(body) < _OFF_LOOP_BYTES or not body.strip():
        return load_parameters(body)
    parameters = _parameters_of(_object(await parse_json_body_off_loop(body)))
    check_override_count(parameters)  # before decoding thousands of them
    return await asyncio.to_thread(_decode_files, parameters)


def _decode_files(parameters: dict[str, Any]) -> dict[str, Any]:
    for key, value in parameters.items():
        if key.startswith(FILE_PREFIX):
            if not isinstance(value, str):
                raise _invalid(f"Load parameter '{key}' must be a base64 string")
            try:
                parameters[key] = _b64decode(value)
            except (binascii.Error, ValueError):
                raise _invalid(f"Load parameter '{key}' is not valid base64") from None
    return parameters


def _b64decode(value: str) -> bytes:
    """`base64.b64decode(value, validate=True)`, in chunks when long (one call holds the lock for
    all of it: 46 ms for 16 MiB)."""
    if len(value) <= _B64_CHUNK:
        return base64.b64decode(value, validate=True)
    if "=" in value.rstrip("="):
        raise ValueError("padding before the end")
    return b"".join(base64.b64decode(value[start:start + _B64_CHUNK], validate=True)
                    for start in range(0, len(value), _B64_CHUNK))


def control_routes(core: FrontendCore) -> list[Route]:
    """The routes, bound to `core`."""

    async def load(request: HttpRequest) -> Response:
        await core.load_model(request.match_info["model"], await _load_parameters(await request.read()))
        return Response(status=200)

    async def unload(request: HttpRequest) -> Response:
        await core.unload_model(request.match_info["model"], _parameters(await request.read()))
        return Response(status=200)

    async def get_logging(_: HttpRequest) -> Response:
        return compact_json(backend_log.settings.as_dict())

    async def post_logging(request: HttpRequest) -> Response:
        return compact_json(backend_log.update_settings(_document(await request.read())))

    return [
        post("/v2/repository/models/{model:[^/]+}/load", load),  # any name, braces too, as Triton
        post("/v2/repository/models/{model:[^/]+}/unload", unload),
        get("/v2/logging", get_logging),
        post("/v2/logging", post_logging),
    ]
