"""The wire form of messages: msgpack arrays `[kind, field, ...]`, and the registry of kinds.

Every message is a NamedTuple registered with `@message(kind)`; a frame decodes straight into a
typed value, and a frame with an unknown kind, the wrong arity or a field of the wrong type is
rejected as corrupt (`MessageDecodeError`), never half-used. Field types are read from the
class's annotations and checked one level deep (a `list[list[int]]` must be a list of lists; what
those hold is the handler's business), leniently where msgpack may blur them (an int is accepted
for a float or a bool). Fields typed with a record of `pystub_backend.ipc.records` (alone, in a
`list[...]` or `| None`) are built into that record, checked the same way; a list of a union of
records builds the one whose length the array has. Every kind is listed,
with its direction and feature, in `pystub_backend.ipc.messages.catalogue`.
"""

from __future__ import annotations

import threading
import types
import typing
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar, Union

import msgpack

__all__ = ["message", "encode", "encode_record", "pack", "decode", "to_array", "from_array", "MessageDecodeError",
           "registered_kinds", "kind_of"]

_T = TypeVar("_T")
_KIND_OF: dict[type, int] = {}
_TYPE_OF: dict[int, type] = {}
_ARITY: dict[int, int] = {}
_Check = Callable[[Any], bool]
_Convert = Callable[[Any], Any]
# Per message or record class, one entry per field that is checked or built (fields annotated
# `Any` are neither): (index, name, allowed types | None, check | None, convert | None). Most
# fields are checked by one isinstance against `allowed`; `check` is for the few that need more (a
# list of lists); `convert` builds records.
_Spec = list[tuple[int, str, "tuple[type, ...] | None", "_Check | None", "_Convert | None"]]
_APPLIERS: dict[type, Callable[[list[Any]], None]] = {}  # per class: its spec compiled (_compile)
_new_tuple = tuple.__new__  # builds a NamedTuple from a list without its per-argument __new__


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


_PACKERS = threading.local()  # a Packer is not safe to share between threads; the stub sends from several


def pack(value: Any) -> bytes:
    """msgpack bytes of `value`, as `msgpack.packb(value, use_bin_type=True)` gives them, from this
    thread's Packer: packb builds (and sets up) a new Packer for every frame."""
    try:
        packer = _PACKERS.packer
    except AttributeError:
        packer = _PACKERS.packer = msgpack.Packer(use_bin_type=True)
    return packer.pack(value)


def encode(value: NamedTuple) -> bytes:
    """The frame for a registered message (records inside it encode as arrays of their fields)."""
    return pack((_KIND_OF[type(value)], *value))


def to_array(value: NamedTuple) -> tuple[Any, ...]:
    """A registered message as the array its frame holds, `(kind, field, ...)`, for a sender that
    packs frames its own way (the frontend workers' link: a stream, and lossless packing)."""
    return (_KIND_OF[type(value)], *value)


def encode_record(value: NamedTuple) -> bytes:
    """The bytes one record takes inside a frame (to tell which part of a frame is too large or
    cannot be carried). Raises TypeError, ValueError or OverflowError as `encode` does."""
    return msgpack.packb(value, use_bin_type=True)


def decode(frame: bytes | memoryview) -> Any:
    """The message in `frame`, its records built. Raises MessageDecodeError for anything that is
    not a valid frame."""
    try:
        items = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for corrupt input
        raise MessageDecodeError(f"undecodable frame of {len(frame)} bytes: {exc}") from exc
    if not isinstance(items, list) or not items or not isinstance(items[0], int):
        raise MessageDecodeError(f"frame of {len(frame)} bytes is not a message array")
    return _message(items)


def from_array(items: Any) -> Any:
    """The message of an unpacked frame array `[kind, field, ...]` (consumed), its records built.
    Raises MessageDecodeError for anything that is not a valid message."""
    if type(items) is not list or not items or type(items[0]) is not int:
        raise MessageDecodeError("a frame that is not a message array")
    return _message(items)


def _message(items: list[Any]) -> Any:
    kind = items[0]
    cls = _TYPE_OF.get(kind)
    if cls is None:
        raise MessageDecodeError(f"unknown message kind {kind}")
    if len(items) - 1 != _ARITY[kind]:
        raise MessageDecodeError(f"message {cls.__name__} has {len(items) - 1} fields, expected {_ARITY[kind]}")
    del items[0]
    _apply(cls, "message", items)
    return _new_tuple(cls, items)


def _apply(cls: type, what: str, values: list[Any]) -> None:
    """Check `values` (the fields of `cls`, in order) and build their records, in place."""
    apply = _APPLIERS.get(cls)
    if apply is None:
        apply = _applier(cls, what)
    apply(values)


def _applier(cls: type, what: str) -> Callable[[list[Any]], None]:
    apply = _APPLIERS[cls] = _compile(cls, what, _spec_of(cls))
    return apply


def _compile(cls: type, what: str, spec: _Spec) -> Callable[[list[Any]], None]:
    """The checks of `spec` as one straight-line function: this runs for every message and record
    of every frame, and unrolled it costs a third of a loop over the spec."""
    namespace: dict[str, Any] = {"_bad": _bad_field(cls, what, spec)}
    lines = ["def apply(values):", "    count = len(values)"]
    for position, (index, _, allowed, check, convert) in enumerate(spec):
        indent = "    "
        if index >= _required(cls):  # a trailing field with a default may be absent from the array
            lines.append(f"    if count > {index}:")
            indent = "        "
        namespace[f"a{position}"], namespace[f"k{position}"], namespace[f"c{position}"] = allowed, check, convert
        test = f"isinstance(values[{index}], a{position})" if allowed is not None else f"k{position}(values[{index}])"
        if allowed is not None or check is not None:
            lines.append(f"{indent}if not {test}: _bad({position}, values[{index}])")
        if convert is not None:
            lines.append(f"{indent}values[{index}] = c{position}(values[{index}])")
    lines.append("    return None")
    exec("\n".join(lines), namespace)  # noqa: S102 - code built above from the class's own annotations
    return namespace["apply"]


def _bad_field(cls: type, what: str, spec: _Spec) -> Callable[[int, Any], None]:
    def bad(position: int, value: Any) -> None:
        raise MessageDecodeError(f"{what} {cls.__name__} has a field '{spec[position][1]}' of type "
                                 f"{type(value).__name__}")
    return bad


def _required(cls: type) -> int:
    return len(cls._fields) - len(cls._field_defaults)  # type: ignore[attr-defined]


def _record_parser(cls: type) -> _Convert:
    """Build a record of `cls` from its array, checked like a message's fields; absent trailing
    fields take their defaults."""
    fields = cls._fields  # type: ignore[attr-defined]
    defaults = [cls._field_defaults[name] for name in fields if name in cls._field_defaults]  # type: ignore[attr-defined]
    total, required = len(fields), len(fields) - len(defaults)

    apply: list[Callable[[list[Any]], None]] = []  # compiled on first use (records may refer to each other)

    def parse(value: Any) -> Any:
        if type(value) is not list or not required <= len(value) <= total:
            raise MessageDecodeError(f"a {cls.__name__} record must be an array of {required}-{total} fields")
        if not apply:
            apply.append(_APPLIERS.get(cls) or _applier(cls, "record"))
        apply[0](value)
        if len(value) < total:
            value.extend(defaults[len(value) - required:])
        return _new_tuple(cls, value)
    return parse


def _union_parser(members: tuple[type, ...]) -> _Convert:
    """Build whichever record of `members` has the array's length (each must have its own)."""
    by_length = {len(member._fields): _record_parser(member) for member in members}  # type: ignore[attr-defined]
    if len(by_length) != len(members) or any(member._field_defaults for member in members):  # type: ignore[attr-defined]
        raise TypeError(f"records {[m.__name__ for m in members]} cannot be told apart by their length")
    names = " | ".join(member.__name__ for member in members)

    def parse(value: Any) -> Any:
        member = by_length.get(len(value)) if type(value) is list else None
        if member is None:
            raise MessageDecodeError(f"a {names} record must be an array of {sorted(by_length)} fields")
        return member(value)
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
        allowed, check, convert = _field_for(hints.get(name, Any))
        if allowed is not None or check is not None or convert is not None:
            spec.append((index, name, allowed, check, convert))
    return spec


def _field_for(annotation: Any) -> tuple[tuple[type, ...] | None, _Check | None, _Convert | None]:
    """(allowed types, shallow type test, record builder) for one annotation; None for each part
    that does not apply ("anything", "as is")."""
    if _is_record(annotation):
        return (list,), None, _record_parser(annotation)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (Union, types.UnionType) and len(args) == 2 and type(None) in args:
        inner = args[0] if args[1] is type(None) else args[1]
        if _is_record(inner):  # `Record | None`
            parse = _record_parser(inner)
            return (list, type(None)), None, lambda value: None if value is None else parse(value)
    if origin is list and args and _is_record(args[0]):  # `list[Record]`
        parse = _record_parser(args[0])
        return (list,), None, lambda value: [parse(item) for item in value]
    members = typing.get_args(args[0]) if origin is list and args else ()
    if members and all(_is_record(member) for member in members):  # `list[RecordA | RecordB]`
        parse = _union_parser(members)
        return (list,), None, lambda value: [parse(item) for item in value]
    allowed = _types_for(annotation)
    if allowed is not None:
        return allowed, None, None
    return None, _check_for(annotation), None


_SCALARS: dict[Any, tuple[type, ...]] = {int: (int,), bool: (bool, int), float: (float, int), str: (str,),
                                         bytes: (bytes,), memoryview: (memoryview,), type(None): (type(None),)}


def _types_for(annotation: Any) -> tuple[type, ...] | None:
    """The types one isinstance test accepts for `annotation`, or None when that test is not
    enough (a list of lists) or there is nothing to test (`Any`)."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        parts = [_types_for(arg) for arg in typing.get_args(annotation)]
        if any(part is None for part in parts):
            return None
        return tuple(t for part in parts for t in part)  # type: ignore[union-attr]
    if origin is list:
        args = typing.get_args(annotation)
        return None if args and typing.get_origin(args[0]) is list else (list,)
    if origin is dict:
        return (dict,)
    return _SCALARS.get(annotation)


def _check_for(annotation: Any) -> _Check | None:
    """A shallow type test for what `_types_for` cannot express (a list of lists), or None."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        parts = [_types_for(arg) or _check_for(arg) for arg in typing.get_args(annotation)]
        if any(part is None for part in parts):
            return None
        return lambda value: any(isinstance(value, part) if isinstance(part, tuple) else part(value)  # type: ignore[misc]
                                 for part in parts)
    if origin is list:
        return lambda value: type(value) is list and all(type(item) is list for item in value)
    return None
