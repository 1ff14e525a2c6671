"""The trace extension's settings, for both protocols (Triton 2.51's shapes and texts); the HTTP
routes are in http/trace_routes.py.

    GET  /v2/trace/setting                  -> the global settings
    POST /v2/trace/setting                  {"trace_rate": "10", "trace_level": ["TIMESTAMPS"], ...}
    GET  /v2/models/{m}/trace/setting       -> the settings in force for model m
    POST /v2/models/{m}/trace/setting       a model's own settings (null clears one)
    gRPC TraceSetting(model_name, settings) the same; a setting with no value clears it

Updating settings changes the server's state: `UpdateGuard` is the access-policy hook (the
`--http-restricted-api trace:...` / `--grpc-restricted-protocol trace:...` restrictions already
apply to these routes through the frontends' restriction layers).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
from tritonclient.grpc import service_pb2

from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.inference import FrontendCore
from pystub_backend.backend.telemetry.tracing import Tracer, TraceSettingError

__all__ = ["trace_settings", "grpc_trace_setting", "UpdateGuard"]

# Access-policy hook for the state-changing call (POST / a gRPC request with settings): given the
# request's headers (metadata), it raises ServerError to refuse. None: no policy beyond the
# restricted-API groups.
UpdateGuard = Callable[[dict[str, str]], Awaitable[None]]

_STATUS = {400: Status.INVALID_ARG, 500: Status.INTERNAL, 501: Status.UNSUPPORTED}


def _check_model(core: FrontendCore, model: str) -> None:
    if model and core.target(model) is None:
        raise ServerError(f"Request for unknown model : {model}", Status.INVALID_ARG)


def trace_settings(tracer: Tracer, core: FrontendCore, model: str = "",
                   update: dict[str, object] | None = None) -> dict[str, object]:
    """The settings (after `update`, when given) in Triton's HTTP JSON shape. Raises ServerError."""
    _check_model(core, model)
    if update is None:
        return tracer.settings.as_json(model)
    try:
        return tracer.update(update, model)
    except TraceSettingError as exc:
        raise ServerError(str(exc), _STATUS.get(exc.status, Status.INVALID_ARG)) from None


# -- gRPC ------------------------------------------------------------------------------------------
def _to_proto(settings: dict[str, object]) -> service_pb2.TraceSettingResponse:
    response = service_pb2.TraceSettingResponse()
    for key, value in settings.items():
        response.settings[key].value.extend(value if isinstance(value, list) else [str(value)])
    return response


async def grpc_trace_setting(tracer: Tracer, core: FrontendCore, request: service_pb2.TraceSettingRequest,
                             context: grpc.aio.ServicerContext,
                             guard: UpdateGuard | None = None) -> service_pb2.TraceSettingResponse:
    """TraceSetting: an update when the request has settings. Raises ServerError."""
    update: dict[str, object] | None = None
    if request.settings:
        update = {key: (list(setting.value) if key == "trace_level" else setting.value[0]) if setting.value
                  else None for key, setting in request.settings.items()}
        if guard is not None:
            await guard({key: value for key, value in context.invocation_metadata() or ()
                         if isinstance(value, str)})
    return _to_proto(trace_settings(tracer, core, request.model_name, update))
