"""Protocol-buffer wire format for the one thing the generated code does slowly: large bytes fields.

Python protobuf copies a `bytes` field on every access and serializes one at 125–240 MiB/s
(50–130 ms for a 16 MiB tensor), while the rest of an inference message is a few hundred bytes.
So the gRPC frontend splits `raw_input_contents` off the serialized request as memoryviews of the
received buffer, lets protobuf parse what remains, and appends `raw_output_contents` to the
serialized response head itself. Both are legal by the wire format: fields may come in any order,
and a repeated field's occurrences concatenate.

The split walks the message in Python, so its cost is per field, not per byte: a message of tiny
fields (two bytes each: 8 million in 16 MiB) once cost a second of CPU per MiB and a list entry per
field. The walk therefore descends into every sub-message protobuf would build and counts every
field at every depth against `MAX_FIELDS`; a message with more is refused before protobuf parses
it. That bounds both the walk and protobuf's own parse, whose cost per field is 20-180 ns (an
empty sub-message costs most), so that no message holds the interpreter longer than a few tens of
milliseconds however its bytes are arranged. Contiguous fields that stay are kept as one span.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError

__all__ = ["split_length_delimited", "append_length_delimited", "Schema", "schema_of", "MAX_FIELDS"]

_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5
# Fields (at every depth) a message split here may have: 131,072 is some 90 ms of walking (off the
# event loop) and 25 ms of protobuf's parse at worst; a request of 20,000 inputs, each with a name,
# datatype, shape and raw contents, stays below it.
MAX_FIELDS = 1 << 17

_YIELD_EVERY = (1 << 12) - 1  # the walk lets go of the interpreter every 4,096 fields

# The sub-messages of a message type: field number -> the sub-message's own schema.
Schema = Mapping[int, "Schema"]


def schema_of(descriptor: Descriptor) -> Schema:
    """The sub-message fields of `descriptor`, recursively (map fields are messages of entries)."""
    schema: dict[int, Schema] = {}
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            schema[field.number] = schema_of(field.message_type)
    return schema


def _read_varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise DecodeError("Error parsing message: truncated or overlong varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field_end(data: memoryview, wire_type: int, pos: int) -> tuple[int, int]:
    """(start of the field's payload, end of the field) for a field whose tag ends at `pos`."""
    if wire_type == _VARINT:
        return pos, _read_varint(data, pos)[1]
    if wire_type == _FIXED64:
        return pos, pos + 8
    if wire_type == _FIXED32:
        return pos, pos + 4
    if wire_type == _LENGTH_DELIMITED:
        length, start = _read_varint(data, pos)
        return start, start + length
    raise DecodeError(f"Error parsing message: unsupported wire type {wire_type}")


class _Budget:
    """The fields a walk may still visit."""

    __slots__ = ("left",)

    def __init__(self, fields: int) -> None:
        self.left = fields

    def take(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise DecodeError(f"Error parsing message: more than {MAX_FIELDS} fields")
        if not self.left & _YIELD_EVERY:
            time.sleep(0)  # let the event loop's thread have the interpreter (this runs off it)


def _walk(view: memoryview, pos: int, end: int, schema: Schema, budget: _Budget) -> None:
    """Check the fields of a sub-message in view[pos:end] (and of its own sub-messages)."""
    while pos < end:
        tag, after_tag = _read_varint(view, pos)
        start, pos = _field_end(view, tag & 7, after_tag)
        if tag >> 3 == 0 or pos > end:
            raise DecodeError("Error parsing message: a field number 0 or a truncated field")
        budget.take()
        inner = schema.get(tag >> 3)
        if inner is not None and tag & 7 == _LENGTH_DELIMITED:
            _walk(view, start, pos, inner, budget)


def split_length_delimited(data: bytes | memoryview, field_number: int, schema: Schema | None = None,
                           max_fields: int = MAX_FIELDS) -> tuple[bytes, list[memoryview]]:
    """Separate every occurrence of length-delimited field `field_number` from a serialized message.

    Returns the message without that field (to parse as usual) and the field's payloads, in order,
    as views of `data` (no copy). `schema` (from `schema_of`) names the sub-messages whose fields
    count too. Raises DecodeError for a malformed or truncated message, or one of more than
    `max_fields` fields.
    """
    view = memoryview(data)
    schema = schema or {}
    budget = _Budget(max_fields)
    rest: list[memoryview] = []
    payloads: list[memoryview] = []
    kept = pos = 0  # view[kept:pos] is a run of fields that stay
    while pos < len(view):
        tag, after_tag = _read_varint(view, pos)
        start, end = _field_end(view, tag & 7, after_tag)
        if tag >> 3 == 0 or end > len(view):
            raise DecodeError("Error parsing message: a field number 0 or a truncated field")
        budget.take()
        if tag >> 3 == field_number and tag & 7 == _LENGTH_DELIMITED:
            if kept < pos:
                rest.append(view[kept:pos])
            payloads.append(view[start:end])
            kept = end
        elif tag & 7 == _LENGTH_DELIMITED and tag >> 3 in schema:
            _walk(view, start, end, schema[tag >> 3], budget)
        pos = end
    if kept < pos:
        rest.append(view[kept:pos])
    return b"".join(rest), payloads


def append_length_delimited(head: bytes, field_number: int, payloads: Iterable[memoryview | bytes]) -> bytes:
    """`head` (a serialized message) followed by one occurrence of the field per payload."""
    tag = _varint(field_number << 3 | _LENGTH_DELIMITED)
    parts: list[bytes | memoryview] = [head]
    for payload in payloads:
        parts += (tag, _varint(payload.nbytes if isinstance(payload, memoryview) else len(payload)), payload)
    return b"".join(parts)
