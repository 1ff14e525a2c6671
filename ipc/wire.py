"""The wire form of messages: msgpack arrays `[kind, field, ...]`, and the registry of kinds.

Every message is a NamedTuple registered with `@message(kind)`; a frame decodes straight into a
typed value, and a frame with an unknown kind or the wrong arity is rejected as corrupt
(`MessageDecodeError`), never half-used. Kind numbers are allocated by range so that each
feature keeps its catalogue in a module of its own:

    1-19   core (ipc/messages.py)          40-49  sequences
    20-29  BLS and model control           50-59  multiplexing
    30-39  metrics                         60-69  client shared memory
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, TypeVar

import msgpack

__all__ = ["message", "encode", "decode", "MessageDecodeError", "registered_kinds"]

_T = TypeVar("_T")
_KIND_OF: dict[type, int] = {}
_TYPE_OF: dict[int, type] = {}
_ARITY: dict[int, int] = {}


class MessageDecodeError(ValueError):
    """A frame that is not a valid message; the receiver drops it and logs this."""


def message(kind: int) -> Callable[[type[_T]], type[_T]]:
    """Register a NamedTuple class as the message of `kind`. Raises ValueError on a reused kind."""
    def register(cls: type[_T]) -> type[_T]:
        if kind in _TYPE_OF and _TYPE_OF[kind] is not cls:
            raise ValueError(f"message kind {kind} is taken by {_TYPE_OF[kind].__name__}")
        _KIND_OF[cls] = kind
        _TYPE_OF[kind] = cls
        _ARITY[kind] = len(cls._fields)  # type: ignore[attr-defined]
        return cls
    return register


def registered_kinds() -> dict[int, type]:
    return dict(_TYPE_OF)


def encode(value: NamedTuple) -> bytes:
    """The frame for a registered message."""
    return msgpack.packb((_KIND_OF[type(value)], *value), use_bin_type=True)


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
