"""The records that travel inside messages: tensors, requests, responses, errors.

Each is a NamedTuple, so it encodes as the msgpack array of its fields (in this order) and code
that still destructures it positionally keeps working; `pystub_backend.ipc.wire.decode` builds
these from the arrays of a frame, checking arity and field types the way it checks messages.

    WireTensor   = [name, datatype, shape, handle]
                   handle: arena handle [segment, offset, nbytes] (pystub_backend.ipc.arena) or a
                   client-region handle [generation, offset, nbytes, key, inode] (ipc.tensors)
                   or GPU memory by CUDA IPC [-2, device id, export or claim id, offset, nbytes,
                   IPC handle bytes] (BLS outputs; backend.features.bls.device_exports)
    WireRequest  = [rid, id, inputs: [WireTensor], requested_outputs: [name], parameters_json,
                    correlation_id, flags, timeout_us, output_regions | nil, trace_context | nil,
                    device_outputs | nil]
                   output_regions {output name: region handle}: outputs the stub writes straight
                   into client regions; trace_context: the request's trace context as JSON
                   (`{"traceparent": ...}`) when it is traced, which `request.trace()` returns in
                   the stub and a BLS call carries back; device_outputs: the GPU id on which
                   the model's GPU outputs may stay (exported by CUDA IPC) rather than being
                   copied to the host; 8- to 11-element arrays are accepted
    WireResponse = [rid, flags, error: WireError | nil, outputs: [WireTensor], parameters_json | nil]
                   parameters nil marks a flags-only final (no response object)
    WireError    = [code (pystub_backend.ipc.status.Status), message]
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["WireTensor", "WireRequest", "WireResponse", "WireError", "RECORDS", "error_to_wire", "DEVICE_HANDLE_TAG"]

DEVICE_HANDLE_TAG = -2  # first item of a WireTensor handle that names GPU memory by CUDA IPC handle


class WireTensor(NamedTuple):
    name: str
    datatype: str
    shape: list[int]
    handle: list[Any]  # arena handle (3 ints) or region handle (5 items); see the module docstring


class WireError(NamedTuple):
    code: int
    message: str


MAX_ERROR_CHARS = 32 * 1024  # frames are small; a model's error text is cut to fit


def error_to_wire(code: int, message: str) -> WireError:
    """The error as it travels: its text cut to MAX_ERROR_CHARS."""
    if len(message) > MAX_ERROR_CHARS:
        message = message[:MAX_ERROR_CHARS] + "... [truncated]"
    return WireError(int(code), message)


class WireRequest(NamedTuple):
    rid: int
    id: str
    inputs: list[WireTensor]
    requested_outputs: list[str]
    parameters_json: str
    correlation_id: int | str
    flags: int
    timeout_us: int
    output_regions: dict[str, list[Any]] | None = None
    trace_context: str | None = None
    device_outputs: int | None = None


class WireResponse(NamedTuple):
    rid: int
    flags: int
    error: WireError | None
    outputs: list[WireTensor]
    parameters_json: str | None


# Every record class; `wire.decode` builds fields annotated with one of these.
RECORDS: tuple[type, ...] = (WireTensor, WireError, WireRequest, WireResponse)
