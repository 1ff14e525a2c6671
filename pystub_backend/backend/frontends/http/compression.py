"""`Content-Encoding` of request bodies and `Accept-Encoding` of responses: gzip and deflate.

`deflate` means a zlib stream (RFC 9110), which is what tritonclient sends; a bare deflate stream is
accepted too, as aiohttp and browsers do. Decompression is bounded by the input size limit so a
small compressed body cannot expand without limit in memory.
"""

from __future__ import annotations

import zlib

from pystub_backend.backend.errors import ServerError, Status

__all__ = ["compress_body", "decompress_body", "is_identity", "response_encoding"]

# wbits: 16+MAX_WBITS reads a gzip wrapper, MAX_WBITS a zlib wrapper, -MAX_WBITS a bare stream.
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_ZLIB_WBITS = zlib.MAX_WBITS
_RAW_WBITS = -zlib.MAX_WBITS


def _coding(encoding: str | None) -> str:
    """A `Content-Encoding` header's coding as compared: absent or empty is `identity`."""
    return (encoding or "identity").strip().lower()


def is_identity(encoding: str | None) -> bool:
    """Whether a `Content-Encoding` leaves the body as it is (absent, or `identity`)."""
    return _coding(encoding) == "identity"


def decompress_body(body: bytes | bytearray, encoding: str | None, limit: int) -> bytes | bytearray:
    """The body with its `Content-Encoding` undone; at most `limit` bytes once decompressed.

    Raises ServerError: INVALID_ARG for corrupt data or a result above `limit`, UNSUPPORTED for an
    encoding other than gzip, deflate or identity.
    """
    name = _coding(encoding)
    if name == "identity":
        return body
    if name in ("gzip", "x-gzip"):
        return _inflate(body, _GZIP_WBITS, limit, name)
    if name == "deflate":
        # A zlib stream starts with a CMF byte whose low nibble is 8 (the deflate method).
        wbits = _ZLIB_WBITS if body and body[0] & 0x0F == 8 else _RAW_WBITS
        return _inflate(body, wbits, limit, name)
    raise ServerError(f"unsupported Content-Encoding '{encoding}'", Status.UNSUPPORTED)


def _inflate(body: bytes | bytearray, wbits: int, limit: int, name: str) -> bytes:
    inflater = zlib.decompressobj(wbits)
    try:
        # limit + 1 output bytes are enough to tell that the result is too large.
        result = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise _corrupt(name, str(exc)) from None
    if len(result) > limit:
        raise ServerError(
            f"decompressed request body exceeds the maximum input size of {limit} bytes",
            Status.INVALID_ARG,
        )
    if not inflater.eof:
        raise _corrupt(name, "truncated data")
    return result


def _corrupt(name: str, reason: str) -> ServerError:
    message = f"failed to decompress the {name} request body: {reason}"
    return ServerError(message, Status.INVALID_ARG)


def response_encoding(accept_encoding: str | None) -> str | None:
    """`gzip` or `deflate`, the first of them `Accept-Encoding` lists without `q=0`, else None."""
    for part in (accept_encoding or "").split(","):
        token, _, params = part.partition(";")
        name = token.strip().lower()
        if name in ("gzip", "deflate") and not _refused(params):
            return name
    return None


def _refused(params: str) -> bool:
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "q":
            try:
                return float(value) <= 0.0
            except ValueError:
                return True
    return False


def compress_body(body: bytes, encoding: str) -> bytes:
    """`body` compressed as `gzip` or `deflate` (a zlib stream)."""
    if encoding == "gzip":
        compressor = zlib.compressobj(wbits=_GZIP_WBITS)
        return compressor.compress(body) + compressor.flush()
    return zlib.compress(body)
