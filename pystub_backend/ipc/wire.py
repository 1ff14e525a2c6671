"""The wire form of messages: msgpack arrays `[kind, field, ...]`, and the registry of kinds.

Every message is a NamedTuple registered with `@message(kind)`; a frame decodes straight into a
typed value, and a frame with an unknown kind, the wrong arity or a field of the wrong type is
rejected as corrupt (`MessageDecodeError`), never half-used. Field types are read from the
class's annotations and checked one level deep (a `list[list[int]]` must be a list of lists; what
those hold is the handler's business), leniently where msgpack may blur them (an int is accepted
for a float or a bool). Kind numbers are allocated by range so that each
feature keeps its catalogue in a module of its own:

    1-19   core (pystub_backend/ipc/messages/core.py)          40-49  sequences
    20-29  BLS and model control           50-59  multiplexing
    30-39  metrics                         60-69  client shared memory
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar, Union

import msgpack

__all__ = ["message", "encode", "decode", "MessageDecodeError", "registered_kinds"]

_T = TypeVar("_T")
_KIND_OF: dict[type, int] = {}
_TYPE_OF: dict[int, type] = {}
_ARITY: dict[int, int] = {}
_Check = Callable[[Any], bool]
_CHECKS: dict[int, list[tuple[str, _Check]]] = {}  # per kind, built on first decode


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
    checks = _CHECKS.get(kind)
    if checks is None:
        checks = _CHECKS[kind] = _field_checks(cls)
    for index, (name, check) in enumerate(checks, 1):
        if not check(items[index]):
            raise MessageDecodeError(f"message {cls.__name__} has a field '{name}' of type "
                                     f"{type(items[index]).__name__}")
    return cls(*items[1:])


def _field_checks(cls: type) -> list[tuple[str, _Check]]:
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve is simply not checked
        hints = {}
    checks: list[tuple[str, _Check]] = []
    for name in cls._fields:  # type: ignore[attr-defined]
        check = _check_for(hints.get(name, Any))
        checks.append((name, check if check is not None else _anything))
    return checks


def _anything(value: Any) -> bool:
    return True


_SCALARS: dict[Any, tuple[type, ...]] = {int: (int,), bool: (bool, int), float: (float, int), str: (str,),
                                         bytes: (bytes,), type(None): (type(None),)}


def _check_for(annotation: Any) -> _Check | None:
    """A shallow type test for one annotation, or None for "anything"."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        parts = [_check_for(arg) for arg in typing.get_args(annotation)]
        if any(part is None for part in parts):
            return None
        return lambda value: any(part(value) for part in parts)  # type: ignore[misc]
    if origin is list:
        args = typing.get_args(annotation)
        if args and typing.get_origin(args[0]) is list:
            return lambda value: type(value) is list and all(type(item) is list for item in value)
        return lambda value: type(value) is list
    if origin is dict:
        return lambda value: type(value) is dict
    allowed = _SCALARS.get(annotation)
    if allowed is None:
        return None
    return lambda value: isinstance(value, allowed)
