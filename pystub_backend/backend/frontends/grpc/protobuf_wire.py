"""Protocol-buffer wire format for the one thing the generated code does slowly: large bytes fields.

Python protobuf copies a `bytes` field on every access and serializes one at 125–240 MiB/s
(50–130 ms for a 16 MiB tensor), while the rest of an inference message is a few hundred bytes.
So the gRPC frontend splits `raw_input_contents` off the serialized request as memoryviews of the
received buffer, lets protobuf parse what remains, and appends `raw_output_contents` to the
serialized response head itself. Both are legal by the wire format: fields may come in any order,
and a repeated field's occurrences concatenate.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["split_length_delimited", "append_length_delimited"]

_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5


def _read_varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint in protobuf message")
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
    raise ValueError(f"unsupported protobuf wire type {wire_type}")


def split_length_delimited(data: bytes, field_number: int) -> tuple[bytes, list[memoryview]]:
    """Separate every occurrence of length-delimited field `field_number` from a serialized message.

    Returns the message without that field (to parse as usual) and the field's payloads, in order,
    as views of `data` (no copy). Raises ValueError for a malformed or truncated message.
    """
    view = memoryview(data)
    rest: list[memoryview] = []
    payloads: list[memoryview] = []
    pos = 0
    while pos < len(view):
        tag, after_tag = _read_varint(view, pos)
        start, end = _field_end(view, tag & 7, after_tag)
        if end > len(view):
            raise ValueError("truncated protobuf message")
        if tag >> 3 == field_number and tag & 7 == _LENGTH_DELIMITED:
            payloads.append(view[start:end])
        else:
            rest.append(view[pos:end])
        pos = end
    return b"".join(rest), payloads


def append_length_delimited(head: bytes, field_number: int, payloads: Iterable[memoryview | bytes]) -> bytes:
    """`head` (a serialized message) followed by one occurrence of the field per payload."""
    tag = _varint(field_number << 3 | _LENGTH_DELIMITED)
    parts: list[bytes | memoryview] = [head]
    for payload in payloads:
        parts += (tag, _varint(payload.nbytes if isinstance(payload, memoryview) else len(payload)), payload)
    return b"".join(parts)
