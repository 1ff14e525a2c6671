"""The core message catalogue (kinds 1-19); the wire form and the kind registry are in `pystub_backend.ipc.wire`.

Tensor bytes never travel in frames: frames carry arena handles `[segment, offset, nbytes]`.
Features keep their messages in modules of their own (kinds by range); the package
`pystub_backend.ipc.messages` imports them all and lists every kind in `catalogue.CATALOGUE`.

    backend -> stub                       stub -> backend
    ---------------                       ---------------
    AutoComplete                          AutoCompleteDone
    Init                                  InitDone
    Execute (requests, releases)          ExecuteDone (responses returned by execute)
    Release (s2p handles, credits)        Response (sent through a response sender)
    Cancel (request ids)
    Spilled (arena handle)                Spilled (arena handle): a frame over the frame limit
    Finalize                              FinalizeDone
    IsReady                               IsReadyDone
                                          Log
                                          Release (p2s handles; inputs the stub is done with)

Records inside messages (WireRequest, WireResponse, WireTensor, WireError) are NamedTuples of
`pystub_backend.ipc.records`, where their array forms are drawn.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pystub_backend.ipc.records import WireError, WireRequest, WireResponse, WireTensor
from pystub_backend.ipc.wire import MessageDecodeError, decode, encode, encode_record, message

__all__ = [
    "MessageDecodeError", "encode", "encode_record", "decode",
    "AutoComplete", "AutoCompleteDone", "Init", "InitDone", "Execute", "ExecuteDone",
    "Response", "Release", "Log", "Finalize", "FinalizeDone", "IsReady", "IsReadyDone", "Cancel",
    "Spilled", "RESPONSE_FINAL", "WireError", "WireRequest", "WireResponse", "WireTensor",
]

RESPONSE_FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL


@message(1)
class AutoComplete(NamedTuple):
    model_path: str
    config_json: str


@message(2)
class AutoCompleteDone(NamedTuple):
    config_json: str | None
    error: str | None


@message(3)
class Init(NamedTuple):
    model_path: str
    args: dict[str, str]
    settings: dict[str, Any]
    sources: dict[str, bytes] | None = None  # absolute path -> the bytes to import instead of the file


@message(4)
class InitDone(NamedTuple):
    error: str | None  # the exception text clients and logs match
    traceback: str | None
    has_is_ready: bool


@message(5)
class Execute(NamedTuple):
    batch_id: int
    requests: list[WireRequest]
    releases: list[list[int]]


@message(6)
class ExecuteDone(NamedTuple):
    batch_id: int
    error: WireError | None
    responses: list[WireResponse]
    # When the stub was done with the batch before this one (time.monotonic_ns(), the clock both
    # processes share; 0 before its first): a batch sent while that one still ran waited in the
    # stub's queue until then, and the backend counts that wait as queue time, not compute.
    busy_until_ns: int = 0


@message(7)
class Response(NamedTuple):
    response: WireResponse


@message(8)
class Release(NamedTuple):
    handles: list[list[int]]
    credits: list[int]  # request ids, one entry per consumed data response (flow control)


@message(14)
class Cancel(NamedTuple):
    rids: list[int]


@message(15)
class Spilled(NamedTuple):
    """A frame too large for the channel, written into the sender's arena (pystub_backend.ipc.spill)."""

    handle: list[int]


@message(9)
class Log(NamedTuple):
    level: int
    message: str
    filename: str
    lineno: int


@message(10)
class Finalize(NamedTuple):
    pass


@message(11)
class FinalizeDone(NamedTuple):
    error: str | None


@message(12)
class IsReady(NamedTuple):
    token: int


@message(13)
class IsReadyDone(NamedTuple):
    token: int
    ready: bool
    error: str | None  # why not ready, in the text clients see

