"""BLS and model-control messages (kinds 20-29).

    stub -> backend                              backend -> stub
    ---------------                              ---------------
    BlsRequest (call id, target, request)        BlsResponse (call id, response)   0..N, last FINAL
    BlsCancel (call ids)
    BlsCleanup (p2s handles, credits)
    ModelControl (token, operation, arguments)   ModelControlDone (token, result, error)
    BlsInspect (token)                           BlsInspectDone (token, facts)
    DeviceCleanup (claim ids)                    DeviceRelease (export ids)

A BLS call's inputs are in the calling stub's s2p arena (the stub writes them); the backend reads
them in place and copies them once, into the target stub's p2s arena. Every response's outputs
arrive in the calling stub's p2s arena (the backend writes them, copied once from the target's
s2p). The backend sends exactly one FINAL response per call, and only after it stopped reading
the call's inputs: the stub frees its input handles then.

BlsCleanup is the original's cleanup message made general: the p2s handles of BLS outputs the
stub no longer references (the backend frees them) and one credit per response a decoupled call's
iterator has taken (the backend forwards at most `BLS_CREDIT_WINDOW` responses ahead of them).

GPU outputs of a BLS call whose caller asked for them on that GPU (`PreferredMemory`) travel by
CUDA IPC handle instead (a WireTensor handle tagged -2, see backend.features.bls.device_exports):
the caller sends DeviceCleanup with the claim ids of the mappings it closed, and the producing
stub gets DeviceRelease once nobody maps an export any more, and only then drops the tensor.

Records are the core ones (pystub_backend.ipc.records): `request` is a WireRequest with the call id as
its rid, `response` a WireResponse with the call id as its rid.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pystub_backend.ipc.records import WireRequest, WireResponse
from pystub_backend.ipc.wire import message

__all__ = [
    "BlsRequest", "BlsResponse", "BlsCancel", "BlsCleanup", "ModelControl", "ModelControlDone",
    "BlsInspect", "BlsInspectDone", "DeviceCleanup", "DeviceRelease", "BLS_CREDIT_WINDOW",
]

# Responses of one decoupled BLS call the backend may have forwarded and the iterator not taken.
BLS_CREDIT_WINDOW = 64


@message(20)
class BlsRequest(NamedTuple):
    call_id: int
    model_name: str
    model_version: str  # "" for the latest (the model's `model_version=-1`)
    request: WireRequest  # its rid is the call id
    decoupled: bool
    holds: bool  # the caller's execute cannot return before this call ends (deadlock detection)


@message(21)
class BlsResponse(NamedTuple):
    call_id: int
    response: WireResponse  # its rid is the call id


@message(22)
class BlsCancel(NamedTuple):
    call_ids: list[int]


@message(23)
class BlsCleanup(NamedTuple):
    handles: list[list[int]]  # p2s handles of BLS outputs the stub is done with
    credits: list[int]  # call ids, one entry per response a decoupled call's iterator has taken


@message(24)
class ModelControl(NamedTuple):
    token: int
    operation: str  # "load", "unload", "ready"
    arguments: dict[str, Any]


@message(25)
class ModelControlDone(NamedTuple):
    token: int
    result: Any
    error: str | None


@message(26)
class BlsInspect(NamedTuple):
    token: int


@message(27)
class BlsInspectDone(NamedTuple):
    token: int
    facts: dict[str, Any]


@message(28)
class DeviceCleanup(NamedTuple):
    claims: list[int]  # claim ids of GPU outputs whose mapping the stub closed


@message(29)
class DeviceRelease(NamedTuple):
    exports: list[int]  # export ids of this stub's GPU outputs that nobody maps any more
