"""The one exception type the backend's core raises towards the frontends.

Every error a client can see is a `ServerError` carrying a `Status`; the frontends map the status to
an HTTP status code or a gRPC code with the tables below (docs/reference/protocol.md#listeners-limits-and-errors).
"""

from __future__ import annotations

import grpc

from pystub_backend.ipc.status import Status

__all__ = ["ServerError", "http_status", "grpc_code", "grpc_details", "Status", "forget_traceback"]

_HTTP_STATUS = {
    Status.UNKNOWN: 400,
    Status.INVALID_ARG: 400,
    Status.ALREADY_EXISTS: 400,
    Status.CANCELLED: 400,
    Status.INTERNAL: 500,
    Status.NOT_FOUND: 404,
    Status.UNAVAILABLE: 503,
    Status.UNSUPPORTED: 501,
}

_GRPC_CODE = {
    Status.UNKNOWN: grpc.StatusCode.UNKNOWN,
    Status.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    Status.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Status.CANCELLED: grpc.StatusCode.CANCELLED,
    Status.INTERNAL: grpc.StatusCode.INTERNAL,
    Status.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Status.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Status.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
}


class ServerError(Exception):
    """An error with a client-visible status and message."""

    def __init__(self, message: str, status: Status = Status.INTERNAL) -> None:
        super().__init__(message)
        self.message = message
        self.status = Status.coerce(status)

    def __repr__(self) -> str:
        return f"ServerError({self.message!r}, {self.status.name})"


def http_status(status: Status) -> int:
    return _HTTP_STATUS[Status.coerce(status)]


def grpc_code(status: Status) -> grpc.StatusCode:
    return _GRPC_CODE[Status.coerce(status)]


# gRPC clients refuse a status whose details (percent-encoded, up to 3 bytes a character) outgrow
# 16 KiB of trailers, and report RESOURCE_EXHAUSTED instead: an error echoing a 140 KB request id
# would reach the client as the wrong error. Cut to what always fits.
_GRPC_DETAILS_CHARS = 4096


def grpc_details(message: str) -> str:
    """`message` cut to what a gRPC status carries to every client."""
    if len(message) <= _GRPC_DETAILS_CHARS:
        return message
    return f"{message[:_GRPC_DETAILS_CHARS]}... [{len(message) - _GRPC_DETAILS_CHARS} characters cut]"


def forget_traceback(error: BaseException) -> None:
    """Drop the tracebacks of a handled exception and of the ones chained to it.

    A ServerError often lives on in an object its traceback's frames reference (a response, a
    stream, a future): a reference cycle that keeps every frame's locals, the request and its
    tensors included, alive until the garbage collector's rare full pass. Failing 16 MiB requests
    piled up gigabytes that way. The frontends call this once they have answered with the error.
    """
    pending: list[BaseException | None] = [error]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        current.__traceback__ = None
        pending += [current.__cause__, current.__context__]
