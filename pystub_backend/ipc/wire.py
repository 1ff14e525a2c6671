"""The wire form of messages: msgpack arrays `[kind, field, ...]`, and the registry of kinds.

Every message is a NamedTuple registered with `@message(kind)`; a frame decodes straight into a
typed value, and a frame with an unknown kind, the wrong arity or a field of the wrong type is
rejected as corrupt (`MessageDecodeError`), never half-used. Field types are read from the
class's annotations and checked one level deep (a `list[list[int]]` must be a list of lists; what
those hold is the handler's business), leniently where msgpack may blur them (an int is accepted
for a float or a bool). Fields typed with a record of `pystub_backend.ipc.records` (alone, in a
`list[...]` or `| None`) are built into that record, checked the same way. Every kind is listed,
with its direction and feature, in `pystub_backend.ipc.messages.catalogue`.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar, Union

import msgpack

__all__ = ["message", "encode", "decode", "MessageDecodeError", "registered_kinds", "kind_of"]

_T = TypeVar("_T")
_KIND_OF: dict[type, int] = {}
_TYPE_OF: dict[int, type] = {}
_ARITY: dict[int, int] = {}
_Check = Callable[[Any], bool]
_Convert = Callable[[Any], Any]
# Per message or record class, built on first decode: (index, name, check | None, convert | None)
# for each field that is checked or built; fields annotated `Any` are neither.
_Spec = list[tuple[int, str, "_Check | None", "_Convert | None"]]
_SPECS: dict[type, _Spec] = {}


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


def kind_of(cls: type) -> int:
    """The kind number of a registered message class. Raises KeyError for any other class."""
    return _KIND_OF[cls]


def encode(value: NamedTuple) -> bytes:
    """The frame for a registered message (records inside it encode as arrays of their fields)."""
    return msgpack.packb((_KIND_OF[type(value)], *value), use_bin_type=True)


def decode(frame: bytes) -> Any:
    """The message in `frame`, its records built. Raises MessageDecodeError for anything that is
    not a valid frame."""
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
    del items[0]
    _apply(cls, "message", items)
    return cls(*items)


def _apply(cls: type, what: str, values: list[Any]) -> None:
    """Check `values` (the fields of `cls`, in order) and build their records, in place."""
    spec = _SPECS.get(cls)
    if spec is None:
        spec = _SPECS[cls] = _spec_of(cls)
    count = len(values)
    for index, name, check, convert in spec:
        if index >= count:  # a trailing field with a default, absent from this array
            return
        value = values[index]
        if check is not None and not check(value):
            raise MessageDecodeError(f"{what} {cls.__name__} has a field '{name}' of type {type(value).__name__}")
        if convert is not None:
            values[index] = convert(value)


def _record_parser(cls: type) -> _Convert:
    """Build a record of `cls` from its array, checked like a message's fields."""
    fields = cls._fields  # type: ignore[attr-defined]
    total, required = len(fields), len(fields) - len(cls._field_defaults)  # type: ignore[attr-defined]

    def parse(value: Any) -> Any:
        if type(value) is not list or not required <= len(value) <= total:
            raise MessageDecodeError(f"a {cls.__name__} record must be an array of {required}-{total} fields")
        _apply(cls, "record", value)
        return cls(*value)
    return parse


def _is_record(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, tuple) and hasattr(annotation, "_fields")


def _spec_of(cls: type) -> _Spec:
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve is simply not checked
        hints = {}
    spec: _Spec = []
    for index, name in enumerate(cls._fields):  # type: ignore[attr-defined]
        check, convert = _field_for(hints.get(name, Any))
        if check is not None or convert is not None:
            spec.append((index, name, check, convert))
    return spec


def _field_for(annotation: Any) -> tuple[_Check | None, _Convert | None]:
    """(shallow type test, record builder) for one annotation; None for "anything" / "as is"."""
    if _is_record(annotation):
        return None, _record_parser(annotation)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (Union, types.UnionType) and len(args) == 2 and type(None) in args:
        inner = args[0] if args[1] is type(None) else args[1]
        if _is_record(inner):  # `Record | None`
            parse = _record_parser(inner)
            return None, lambda value: None if value is None else parse(value)
    if origin is list and args and _is_record(args[0]):  # `list[Record]`
        parse = _record_parser(args[0])
        return _is_list, lambda value: [parse(item) for item in value]
    return _check_for(annotation), None


def _is_list(value: Any) -> bool:
    return type(value) is list


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
