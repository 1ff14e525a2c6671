"""The backend side of BLS and of model control from a stub: frame handlers (supervision.handlers).

    BlsRequest       → checks (docs/reference/model-api.md#bls) → BlsCall (pystub_backend.backend.features.bls.call)
    in the payload registry BlsCancel        → BlsCall.cancel BlsCleanup       → free the caller's p2s bytes of BLS
    outputs; credits to decoupled calls ModelControl     → Core.load_model / unload_model / model_ready →
    ModelControlDone BlsInspect       → BlsInspectDone (registry size, arena bytes; diagnostics and leak tests)
    DeviceCleanup    → DEVICE_EXPORTS.release (mappings of GPU outputs the caller closed); exports nobody
    holds any more → DeviceRelease to their producing stub

Target checks, in Triton's order and with its texts:
    unknown model or version   `Model <m> - Error when running inference: Request for unknown model: ...`
    not ready                  `Failed for execute the inference request. Model '<m>' is not ready.`
    decoupled target           `Model <m> is using the decoupled. The current BLS request call doesn't
                               support models using the decoupled transaction policy. ...` (sic)
    certain deadlock           pystub's own text (pystub_backend.backend.features.bls.deadlock)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, NamedTuple

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.features.bls.call import BlsCall, build_request
from pystub_backend.backend.features.bls.deadlock import deadlock_reason
from pystub_backend.backend.features.bls.device_exports import DeviceExports
from pystub_backend.backend.features.bls.device_inputs import accepts_device_inputs
from pystub_backend.backend.features.bls.payloads import REGISTRY
from pystub_backend.backend.inference import InferRequest
from pystub_backend.ipc.channel import ChannelClosedError, ChannelTimeoutError
from pystub_backend.ipc.messages.bls import (
    BlsCancel,
    BlsCleanup,
    BlsInspect,
    BlsInspectDone,
    BlsRequest,
    DeviceCleanup,
    DeviceRelease,
    ModelControl,
    ModelControlDone,
)
from pystub_backend.ipc.status import Status

if TYPE_CHECKING:
    from pystub_backend.backend.supervision.handlers import BackendHandlers
    from pystub_backend.backend.supervision.services import StubFacingCore
    from pystub_backend.backend.supervision.stub_process import StubProcess

__all__ = ["register", "target_error", "DECOUPLED_TEXT", "DEVICE_EXPORTS"]

log = logging.getLogger("pystub.bls")

DECOUPLED_TEXT = ("Model {m} is using the decoupled. The current BLS request call doesn't support models using "
                  "the decoupled transaction policy. Please use 'decoupled=True' argument to the 'exec' or "
                  "'async_exec' calls for decoupled models.'")
_tasks: set[asyncio.Task[Any]] = set()  # replies in flight (kept referenced until done)


def _spawn(coroutine: Awaitable[Any]) -> None:
    task = asyncio.ensure_future(coroutine)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


def _tell_exporter(exporter: StubProcess, export_ids: list[int]) -> None:
    _spawn(_reply(exporter, DeviceRelease(export_ids)))


DEVICE_EXPORTS = DeviceExports(_tell_exporter)


def target_error(core: StubFacingCore, call: BlsCall) -> ServerError | None:
    """Why `call` cannot run (docs/reference/model-api.md#bls target checks, then deadlock), or None;
    the version it looked up is noted as `call.target`, which serves the call while it is ready."""
    name, version = call.request.model_name, call.request.model_version
    try:
        found = call.target = core.version_for(name, version)
    except ServerError as exc:  # an unknown or unloaded model: Triton's text says "not ready"
        known = bool(core.versions_of(name))
        detail = exc.message if known else f"Failed for execute the inference request. Model '{name}' is not ready."
        return ServerError(f"Model {name} - Error when running inference: {detail}", exc.status)
    if not any(v.ready for v in core.versions_of(name) if not version or str(v.version) == version):
        return ServerError(f"Failed for execute the inference request. Model '{name}' is not ready.",
                           Status.UNAVAILABLE)
    if found.decoupled and not call.decoupled:
        return ServerError(DECOUPLED_TEXT.format(m=name), Status.INVALID_ARG)
    # the calls in flight are read only when no instance of the target is free (deadlock_reason)
    others = (payload for payload in REGISTRY.payloads() if payload is not call)
    reason = deadlock_reason(core, others, call.caller, name, call.holds)
    return ServerError(reason, Status.UNAVAILABLE) if reason else None


def _on_request(stub: StubProcess, message: BlsRequest) -> None:
    core = stub.services.core
    corrupt: ServerError | None = None
    try:
        request = build_request(stub, message)
    except (ValueError, TypeError, IndexError, KeyError, OSError) as exc:
        request = InferRequest(str(message.model_name))
        corrupt = ServerError(f"corrupt BLS request from stub '{stub.instance_name}': {exc}", Status.INTERNAL)
    if core is None:  # a stub outside a server (tools): nothing to call
        corrupt = corrupt or ServerError(f"stub '{stub.instance_name}' has no server to call", Status.UNAVAILABLE)
    call = BlsCall(core, stub, message, request)

    def checks() -> ServerError | None:
        return corrupt or (target_error(core, call) if core is not None else None)

    try:
        call.start(checks)
    except KeyError as exc:
        log.error("%s", exc.args[0])
        call.drop_device_inputs()


def _on_cancel(stub: StubProcess, message: BlsCancel) -> None:
    for call_id in message.call_ids:
        call = REGISTRY.get((stub.base, call_id))
        if call is not None:
            call.cancel()


def _on_cleanup(stub: StubProcess, message: BlsCleanup) -> None:
    p2s = stub.p2s
    if p2s is not None:
        for handle in message.handles:
            try:
                p2s.free(handle)
            except (KeyError, IndexError, TypeError, ValueError):
                log.error("stub '%s' released an unknown BLS output handle %s", stub.instance_name, handle)
    counts: dict[int, int] = {}
    for call_id in message.credits:
        counts[call_id] = counts.get(call_id, 0) + 1
    for call_id, count in counts.items():
        call = REGISTRY.get((stub.base, call_id))
        if call is not None:
            call.credit(count)


def _on_device_cleanup(stub: StubProcess, message: DeviceCleanup) -> None:
    # Claims of an exporter that died were dropped with its exports: nothing to do for them.
    DEVICE_EXPORTS.release(stub, list(message.claims))


async def _reply(stub: StubProcess, message: NamedTuple) -> None:
    if not stub.alive:
        return
    try:
        await stub.send(message)
    except (ChannelClosedError, ChannelTimeoutError) as exc:
        log.warning("could not answer stub '%s': %s", stub.instance_name, exc)


def _on_inspect(stub: StubProcess, message: BlsInspect) -> None:
    facts = {
        "registry_size": len(REGISTRY),
        "caller_calls": sum(1 for _ in REGISTRY.of_caller(stub)),
        "p2s_used": stub.p2s.used if stub.p2s is not None else 0,
        "p2s_allocations": stub.p2s.allocation_count if stub.p2s is not None else 0,
        "device_exports": len(DEVICE_EXPORTS),
        "device_claims": DEVICE_EXPORTS.claims(),
    }
    _spawn(_reply(stub, BlsInspectDone(message.token, facts)))


def _on_model_control(stub: StubProcess, message: ModelControl) -> None:
    _spawn(_model_control(stub, message))


async def _model_control(stub: StubProcess, message: ModelControl) -> None:
    core, arguments = stub.services.core, message.arguments
    result: bool | None = None
    error: str | None = None
    try:
        if core is None:
            raise ServerError(f"stub '{stub.instance_name}' has no server to control")
        name = arguments["name"]
        if message.operation == "load":
            parameters: dict[str, Any] = dict(arguments.get("files") or {})
            if arguments.get("config"):
                parameters["config"] = arguments["config"]
            await core.load_model(name, parameters)
        elif message.operation == "unload":
            await core.unload_model(name, {"unload_dependents": bool(arguments.get("unload_dependents"))})
        elif message.operation == "ready":
            result = bool(await core.model_ready(name, str(arguments.get("version") or "")))
        elif message.operation == "device_inputs":  # may a BLS call hand this model GPU inputs as they are
            config = core.model_config(name, str(arguments.get("version") or ""))
            result = accepts_device_inputs(config, int(arguments["device"]))
        else:
            error = f"unknown model control operation '{message.operation}'"
    except ServerError as exc:  # Triton's Python backend wraps the server's answer so
        error = f"Failed to process the request for model '{stub.instance_name}', message: {exc.message}"
    except Exception as exc:  # the model gets the reason instead of waiting for its deadline
        log.exception("model control '%s' from stub '%s' failed", message.operation, stub.instance_name)
        error = f"{type(exc).__name__}: {exc}"
    await _reply(stub, ModelControlDone(message.token, result, error))


def register(handlers: BackendHandlers) -> None:
    """BLS calls and model control from the stubs."""
    handlers.on_frame(BlsRequest, _on_request)
    handlers.on_frame(BlsCancel, _on_cancel)
    handlers.on_frame(BlsCleanup, _on_cleanup)
    handlers.on_frame(DeviceCleanup, _on_device_cleanup)
    handlers.on_frame(BlsInspect, _on_inspect)
    handlers.on_frame(ModelControl, _on_model_control)
