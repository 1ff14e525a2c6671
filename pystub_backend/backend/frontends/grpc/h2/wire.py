"""gRPC's HTTP/2 wire (the "gRPC over HTTP2" protocol), none of it tied to a connection.

    message   1 byte compressed flag | 4 bytes big-endian length | the message (maybe compressed)
    request   HEADERS (:path /package.Service/Method, content-type application/grpc..., grpc-timeout,
              grpc-encoding, metadata; `-bin` keys carry base64) then DATA: messages
    response  HEADERS (:status 200, content-type, initial metadata) DATA: messages,
              then trailers: grpc-status, grpc-message (percent-encoded), trailing metadata;
              a response without messages may be "trailers-only": one HEADERS with both.
"""

from __future__ import annotations

import base64
import binascii
import collections
import zlib
from collections.abc import Iterable, Sequence

import grpc

__all__ = ["Header", "Metadata", "MessageReader", "Message", "WireError", "parse_timeout", "metadata_of",
           "metadata_headers", "status_headers", "frame_parts", "compress", "inflate_start", "inflate_rest",
           "response_encoding", "is_grpc_content_type", "header_list_size", "ACCEPT_ENCODING", "SUPPORTED_ENCODINGS",
           "TIMEOUT_DETAILS"]

Header = tuple[bytes, bytes]
Metadata = tuple[tuple[str, str | bytes], ...]

ACCEPT_ENCODING = b"identity,deflate,gzip"
SUPPORTED_ENCODINGS = frozenset({"identity", "deflate", "gzip"})
# Headers of the protocol itself, not the call's metadata (grpc core keeps them out of it too).
_PROTOCOL_HEADERS = frozenset({b"te", b"content-type", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding",
                               b"grpc-message-type"})
_TIMEOUT_UNITS = {ord("H"): 3600.0, ord("M"): 60.0, ord("S"): 1.0, ord("m"): 1e-3, ord("u"): 1e-6, ord("n"): 1e-9}
_PREFIX = 5
# grpc.aio's answer to a grpc-timeout it cannot parse (INTERNAL).
TIMEOUT_DETAILS = "Error parsing 'grpc-timeout' metadata"
# A compressed message is inflated this many bytes at a time, its size checked after each step.
_INFLATE_STEP = 1 << 20
# What one message on the wire is: (its compressed flag, its body as received).
Message = tuple[int, bytes]


class WireError(Exception):
    """A request that breaks the protocol: `code` is the status the call ends with."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def parse_timeout(value: bytes) -> float | None:
    """`grpc-timeout` (digits and a unit, spaces around them allowed, as grpc core reads it) in
    seconds; None when malformed (`-1S`, `1.5S`, `abc`: the call is refused, TIMEOUT_DETAILS)."""
    value = value.strip(b" ")
    digits = value[:-1].rstrip(b" ")
    if not digits.isdigit() or not digits.isascii():
        return None
    unit = _TIMEOUT_UNITS.get(value[-1])
    return None if unit is None else int(digits) * unit


def is_grpc_content_type(value: bytes) -> bool:
    """`application/grpc`, alone or with a `+format` or `;parameters` (the gRPC protocol's
    Content-Type); not `application/grpcfoo` nor `application/grpc-web`."""
    return value == b"application/grpc" or value.startswith((b"application/grpc+", b"application/grpc;"))


def header_list_size(headers: Sequence[Header]) -> int:
    """A header list's size as HTTP/2 and grpc count it: each field's name and value and 32."""
    size = 0
    for name, value in headers:
        size += len(name) + len(value)
    return size + 32 * len(headers)


def metadata_of(headers: Iterable[Header]) -> Metadata:
    """The call's metadata: every header but pseudo-headers and the protocol's own, `-bin` values
    decoded from base64 (padded or not) to bytes. Raises WireError on a bad `-bin` value."""
    items: list[tuple[str, str | bytes]] = []
    for name, value in headers:
        if name[:1] == b":" or name in _PROTOCOL_HEADERS:
            continue
        key = name.decode("ascii", "replace")
        if key.endswith("-bin"):
            try:
                items.append((key, base64.b64decode(value + b"=" * (-len(value) % 4), validate=True)))
            except (binascii.Error, ValueError) as exc:
                raise WireError(grpc.StatusCode.INTERNAL, f"invalid base64 in metadata '{key}'") from exc
        else:
            items.append((key, value.decode("latin-1")))
    return tuple(items)


def metadata_headers(metadata: Iterable[tuple[str, str | bytes]] | None) -> list[Header]:
    """Metadata as headers (`-bin` values base64-encoded, unpadded as grpc core sends them).
    Raises ValueError for a key grpc would refuse (upper case, reserved, or not a token)."""
    headers: list[Header] = []
    for key, value in metadata or ():
        name = key.encode("ascii")
        if name != name.lower() or name[:1] == b":" or name.startswith(b"grpc-") or not name:
            raise ValueError(f"metadata key '{key}' is not allowed")
        if key.endswith("-bin"):
            raw = value if isinstance(value, bytes) else value.encode()
            headers.append((name, base64.b64encode(raw).rstrip(b"=")))
        else:
            headers.append((name, value.encode("latin-1") if isinstance(value, str) else value))
    return headers


def _percent_encode(text: str) -> bytes:
    """grpc-message's encoding: bytes outside printable ASCII, and '%', as %XX."""
    raw = text.encode("utf-8", "replace")
    if all(0x20 <= byte <= 0x7E and byte != 0x25 for byte in raw):
        return raw
    return b"".join(bytes((byte,)) if 0x20 <= byte <= 0x7E and byte != 0x25 else b"%%%02X" % byte for byte in raw)


def status_headers(code: grpc.StatusCode, details: str | None, trailing: Sequence[tuple[str, str | bytes]]
                   ) -> list[Header]:
    """The status trailers: grpc-status, grpc-message when there are details, trailing metadata."""
    headers = [(b"grpc-status", b"%d" % code.value[0])]
    if details:
        headers.append((b"grpc-message", _percent_encode(details)))
    headers.extend(metadata_headers(trailing))
    return headers


def _decompressor(encoding: str) -> zlib._Decompress:
    # grpc's "deflate" is the zlib format (RFC 1950), "gzip" the gzip format
    return zlib.decompressobj(zlib.MAX_WBITS | 16 if encoding == "gzip" else zlib.MAX_WBITS)


def _too_large(size: int, limit: int) -> WireError:
    return WireError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"Received message larger than max ({size} vs. {limit})")


def inflate_start(payload: bytes, encoding: str, limit: int) -> tuple[bytes | None, zlib._Decompress, bytes]:
    """The first step of inflating one message (at most `_INFLATE_STEP` bytes, cheap enough for the
    event loop): (the whole message, or None while there is more; the inflater; what it gave so far).
    Raises WireError: INTERNAL for bytes that do not inflate, RESOURCE_EXHAUSTED above `limit`."""
    inflater = _decompressor(encoding)
    first = _inflate_step(inflater, payload, encoding)
    if 0 <= limit < len(first):
        raise _too_large(len(first), limit)
    if inflater.eof or not inflater.unconsumed_tail and len(first) < _INFLATE_STEP:
        return first, inflater, first
    return None, inflater, first


def inflate_rest(inflater: zlib._Decompress, first: bytes, encoding: str, limit: int) -> bytes:
    """The rest of a message `inflate_start` began, a step at a time, its size checked after each
    step so that a small message that inflates to gigabytes stops at `limit` (a thread's work: zlib
    lets go of the interpreter while it inflates). Raises WireError as `inflate_start`."""
    parts, size = [first], len(first)
    while not inflater.eof:
        chunk = _inflate_step(inflater, inflater.unconsumed_tail, encoding)
        if not chunk:
            break
        size += len(chunk)
        if 0 <= limit < size:
            raise _too_large(size, limit)
        parts.append(chunk)
    return b"".join(parts)


def _inflate_step(inflater: zlib._Decompress, data: bytes, encoding: str) -> bytes:
    try:
        return inflater.decompress(data, _INFLATE_STEP)
    except zlib.error as exc:
        raise WireError(grpc.StatusCode.INTERNAL, f"cannot decompress a {encoding} message: {exc}") from exc


def compress(payload: bytes, encoding: str, level: int = 6) -> bytes:
    if encoding == "gzip":
        packer = zlib.compressobj(level, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    else:
        packer = zlib.compressobj(level, zlib.DEFLATED, zlib.MAX_WBITS)
    return packer.compress(payload) + packer.flush()


def frame_parts(payload: bytes, encoding: str | None = None) -> tuple[bytes, bytes]:
    """One message on the wire as (its 5-byte prefix, its body), compressed with `encoding` when that
    makes it smaller. Two parts, not one: libnghttp2 packs them into the same DATA frame, and the
    body (up to the whole message) is not copied to join them."""
    if encoding is not None:
        packed = compress(payload, encoding)
        if len(packed) < len(payload):
            return b"\x01" + len(packed).to_bytes(4, "big"), packed
    return b"\x00" + len(payload).to_bytes(4, "big"), payload


# grpc core's choice for a compression level: the accepted algorithms in its "ratio" order
# (deflate, gzip); low takes the first, medium the middle one, high the last.
_LEVEL_ORDER = ("deflate", "gzip")


def response_encoding(level: int, accepted: bytes | None) -> str | None:
    """The response messages' encoding for `--grpc-infer-response-compression-level` (0..3) and
    the client's grpc-accept-encoding; None: uncompressed."""
    if level <= 0 or not accepted:
        return None
    offered = {name.strip() for name in accepted.decode("ascii", "replace").split(",")}
    algorithms = [name for name in _LEVEL_ORDER if name in offered]
    if not algorithms:
        return None
    return algorithms[{1: 0, 2: len(algorithms) // 2}.get(level, len(algorithms) - 1)]


class MessageReader:
    """Cuts a stream's DATA into messages (their compressed flag and body: call.py inflates them).

    A message longer than one DATA frame (16 KiB by default) arrives in pieces: they are kept as
    they came and joined once, when the message is whole (one copy; growing one buffer by each
    piece copied a 1 MiB message about ten times over, 3 ms of CPU per message, measured)."""

    def __init__(self, encoding: str | None, max_length: int) -> None:
        self._pieces: collections.deque[bytes | memoryview] = collections.deque()
        self._buffered = 0  # bytes in _pieces
        self._encoding = encoding
        self._max = max_length  # -1: no limit

    @property
    def encoding(self) -> str | None:
        return self._encoding

    @property
    def limit(self) -> int:
        """The receive limit (-1: none)."""
        return self._max

    @property
    def partial(self) -> bool:
        """Whether bytes of an unfinished message are waiting."""
        return self._buffered > 0

    def feed(self, data: bytes) -> list[Message]:
        """The messages `data` completes. Raises WireError for one declared larger than the limit,
        or flagged compressed on a call without a grpc-encoding."""
        if not self._buffered and len(data) >= _PREFIX and len(data) == _PREFIX + int.from_bytes(data[1:5], "big"):
            return [self._message(data[0], data[_PREFIX:])]  # the usual case: one whole message
        if data:
            self._pieces.append(data)
            self._buffered += len(data)
        messages = []
        while self._buffered >= _PREFIX:
            prefix = self._prefix()
            length = int.from_bytes(prefix[1:5], "big")
            if 0 <= self._max < length:
                raise WireError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"Received message larger than max ({length} vs. {self._max})")
            if self._buffered < _PREFIX + length:
                break
            messages.append(self._message(prefix[0], self._take(_PREFIX + length)))
        return messages

    def _prefix(self) -> bytes:
        """The next message's 5-byte prefix (the first piece holds it whole afterwards)."""
        if len(self._pieces[0]) < _PREFIX:  # split across pieces: rare, and bounded by one message
            joined = b"".join(self._pieces)
            self._pieces.clear()
            self._pieces.append(joined)
        return bytes(self._pieces[0][:_PREFIX])

    def _take(self, end: int) -> bytes:
        """The body of the message whose prefix and body are the next `end` bytes, in one copy."""
        parts: list[bytes | memoryview] = []
        taken = 0
        while taken < end:
            piece = memoryview(self._pieces.popleft())
            if taken + len(piece) > end:  # the next message starts inside this piece
                self._pieces.appendleft(piece[end - taken:])
                piece = piece[:end - taken]
            parts.append(piece)
            taken += len(piece)
        self._buffered -= end
        parts[0] = parts[0][_PREFIX:]
        return b"".join(parts)

    def _message(self, flag: int, payload: bytes) -> Message:
        if 0 <= self._max < len(payload):
            raise _too_large(len(payload), self._max)
        if flag != 0 and (flag != 1 or self._encoding is None or self._encoding == "identity"):
            raise WireError(grpc.StatusCode.INTERNAL, "Compression bit set but no encoding configured")
        return flag, payload
