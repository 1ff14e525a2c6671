"""OpenAI's error body and the status codes its client maps to exception classes.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "messages", "code": null}}

    400 BadRequestError       invalid_request_error   a missing or malformed field, a refused model
                                                      (code "context_length_exceeded": too long)
    401 AuthenticationError   invalid_request_error   a restricted group without its header (code "invalid_api_key")
    404 NotFoundError         invalid_request_error   an unknown model (code "model_not_found"), route
    500/503                   server_error / service_unavailable_error

as OpenAI types them (its unknown model and wrong key are invalid_request_error).

Every error raised in a handler (`OpenAIError`, the core's `ServerError`, aiohttp's HTTP
exceptions) leaves through `error_middleware` in this form; an error after a stream has started
becomes an `error` event of the stream instead (generation.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from pystub_backend.backend.errors import ServerError, forget_traceback, http_status

__all__ = ["OpenAIError", "invalid", "error_body", "error_response", "error_middleware", "from_server_error"]

_log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "permission_error",
          404: "invalid_request_error", 405: "invalid_request_error", 501: "invalid_request_error",
          503: "service_unavailable_error"}


class OpenAIError(Exception):
    """An error the client sees with `status` and OpenAI's body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def invalid(message: str, param: str | None = None) -> OpenAIError:
    """A 400 for a request field (`param` names it)."""
    return OpenAIError(400, message, param)


def from_server_error(error: ServerError) -> OpenAIError:
    status = http_status(error.status)
    return OpenAIError(status, error.message, code="model_not_found" if status == 404 else None)


def error_body(error: OpenAIError) -> dict[str, Any]:
    kind = _TYPES.get(error.status, "server_error" if error.status >= 500 else "invalid_request_error")
    return {"error": {"message": error.message, "type": kind, "param": error.param, "code": error.code}}


def error_response(error: OpenAIError) -> web.Response:
    return web.json_response(error_body(error), status=error.status)


_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: _Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except OpenAIError as error:
        return error_response(error)
    except ServerError as error:
        forget_traceback(error)  # it may live on in a stream its frames hold: a cycle
        return error_response(from_server_error(error))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        reason = "request body exceeds the maximum input size" if exc.status == 413 else exc.reason
        return error_response(OpenAIError(400 if exc.status == 413 else exc.status, reason))
    except ConnectionResetError:  # the client left before the request was read: nobody to answer
        return error_response(OpenAIError(400, "the connection closed before the request was read"))
    except Exception as exc:  # noqa: BLE001 - any failure must still answer in OpenAI's form
        _log.exception("OpenAI %s %s failed", request.method, request.path)
        forget_traceback(exc)
        return error_response(OpenAIError(500, str(exc) or type(exc).__name__))
