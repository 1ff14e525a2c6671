"""The message catalogue and its msgpack wire form.

A frame is a msgpack array `[kind, field, ...]`; each kind is a NamedTuple below, so a frame
decodes straight into a typed value and a frame with the wrong arity or an unknown kind is
rejected as corrupt (`MessageDecodeError`), never half-used. Tensor bytes never travel in frames:
frames carry arena handles `[segment, offset, nbytes]`.

    backend -> stub                       stub -> backend
    ---------------                       ---------------
    AutoComplete                          AutoCompleteDone
    Init                                  InitDone
    Execute (requests, releases)          ExecuteDone (responses returned by execute)
    Release (s2p handles, credits)        Response (sent through a response sender)
    Cancel (request ids)
    Finalize                              FinalizeDone
    IsReady                               IsReadyDone
                                          Log
                                          Release (p2s handles; inputs the stub is done with)

Wire tuples inside messages (plain lists, for speed):
    tensor   = [name, datatype, shape, handle]
    request  = [rid, id, inputs: [tensor], requested_outputs: [name], parameters_json,
                correlation_id, flags, timeout_us]
    response = [rid, flags, error: [code, message] | None, outputs: [tensor], parameters_json]
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

import msgpack

__all__ = [
    "Kind", "MessageDecodeError", "encode", "decode",
    "AutoComplete", "AutoCompleteDone", "Init", "InitDone", "Execute", "ExecuteDone",
    "Response", "Release", "Log", "Finalize", "FinalizeDone", "IsReady", "IsReadyDone", "Cancel",
    "RESPONSE_FINAL",
]

RESPONSE_FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL


class Kind(enum.IntEnum):
    AUTO_COMPLETE = 1
    AUTO_COMPLETE_DONE = 2
    INIT = 3
    INIT_DONE = 4
    EXECUTE = 5
    EXECUTE_DONE = 6
    RESPONSE = 7
    RELEASE = 8
    LOG = 9
    FINALIZE = 10
    FINALIZE_DONE = 11
    IS_READY = 12
    IS_READY_DONE = 13
    CANCEL = 14


class MessageDecodeError(ValueError):
    """A frame that is not a valid message; the receiver drops it and logs this."""


class AutoComplete(NamedTuple):
    model_path: str
    config_json: str


class AutoCompleteDone(NamedTuple):
    config_json: str | None
    error: str | None


class Init(NamedTuple):
    model_path: str
    args: dict[str, str]
    settings: dict[str, Any]


class InitDone(NamedTuple):
    error: str | None  # the exception text clients and logs match
    traceback: str | None
    has_is_ready: bool


class Execute(NamedTuple):
    batch_id: int
    requests: list[list[Any]]
    releases: list[list[int]]


class ExecuteDone(NamedTuple):
    batch_id: int
    error: list[Any] | None
    responses: list[list[Any]]


class Response(NamedTuple):
    response: list[Any]


class Release(NamedTuple):
    handles: list[list[int]]
    credits: list[int]  # request ids, one entry per consumed data response (flow control)


class Cancel(NamedTuple):
    rids: list[int]


class Log(NamedTuple):
    level: int
    message: str
    filename: str
    lineno: int


class Finalize(NamedTuple):
    pass


class FinalizeDone(NamedTuple):
    error: str | None


class IsReady(NamedTuple):
    token: int


class IsReadyDone(NamedTuple):
    token: int
    ready: bool
    error: str | None  # why not ready, in the text clients see


_KIND_OF: dict[type, Kind] = {
    AutoComplete: Kind.AUTO_COMPLETE, AutoCompleteDone: Kind.AUTO_COMPLETE_DONE,
    Init: Kind.INIT, InitDone: Kind.INIT_DONE, Execute: Kind.EXECUTE, ExecuteDone: Kind.EXECUTE_DONE,
    Response: Kind.RESPONSE, Release: Kind.RELEASE, Log: Kind.LOG, Finalize: Kind.FINALIZE,
    FinalizeDone: Kind.FINALIZE_DONE, IsReady: Kind.IS_READY, IsReadyDone: Kind.IS_READY_DONE,
    Cancel: Kind.CANCEL,
}
_TYPE_OF: dict[int, type] = {int(kind): cls for cls, kind in _KIND_OF.items()}
_ARITY: dict[int, int] = {int(kind): len(cls._fields) for cls, kind in _KIND_OF.items()}


def encode(message: NamedTuple) -> bytes:
    """The frame for `message`."""
    return msgpack.packb((_KIND_OF[type(message)], *message), use_bin_type=True)


def decode(frame: bytes) -> Any:
    """The message in `frame`. Raises MessageDecodeError for anything that is not a valid frame."""
    try:
        items = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for corrupt input
        raise MessageDecodeError(f"undecodable frame of {len(frame)} bytes: {exc}") from exc
    if not isinstance(items, list) or not items or not isinstance(items[0], int):
        raise MessageDecodeError(f"frame of {len(frame)} bytes is not a message array")
    kind = items[0]
    cls = _TYPE_OF.get(kind)
    if cls is None:
        raise MessageDecodeError(f"unknown message kind {kind}")
    if len(items) - 1 != _ARITY[kind]:
        raise MessageDecodeError(f"message {cls.__name__} has {len(items) - 1} fields, expected {_ARITY[kind]}")
    return cls(*items[1:])
