"""`TritonError` (an error value a model returns) and `TritonModelException` (what pb_utils raises).

`TritonError` is not an exception: models put it into an `InferenceResponse` so that one request
fails while the rest of the batch succeeds. Its codes are `pystub_backend.ipc.status.Status` members, so a code
crosses the process boundary as a plain int and means the same thing on the other side.
"""

from __future__ import annotations

from pystub_backend.ipc.status import Status

from ._binding import MODULE, STR, Arg, PybindRepr, binding, enum_of

__all__ = ["TritonError", "TritonModelException", "ErrorCode", "require_str"]

ErrorCode = Status


class TritonModelException(Exception):
    """Raised by every pb_utils class for a misuse the original reports from its native code.

    `str(exc)` is exactly the text of docs/reference/model-api.md#errors: clients and tests match it.
    """


class TritonError(PybindRepr):
    """An error a model attaches to a response: `TritonError(message, code=TritonError.INTERNAL)`."""

    UNKNOWN = Status.UNKNOWN
    INTERNAL = Status.INTERNAL
    NOT_FOUND = Status.NOT_FOUND
    INVALID_ARG = Status.INVALID_ARG
    UNAVAILABLE = Status.UNAVAILABLE
    UNSUPPORTED = Status.UNSUPPORTED
    ALREADY_EXISTS = Status.ALREADY_EXISTS
    CANCELLED = Status.CANCELLED

    __slots__ = ("_message", "_code")

    @binding(f"{MODULE}.TritonError(message: str, code: {MODULE}.TritonError.__ErrorCode = <__ErrorCode.INTERNAL: 1>)",
             Arg("message", STR), Arg("code", enum_of(Status), Status.INTERNAL))
    def __init__(self, message: str, code: Status = Status.INTERNAL) -> None:
        """Raises TypeError (pybind11's text) when `message` is not a str or `code` is not one of
        the class's codes (plain ints included, as in the original)."""
        self._message = require_str("message", message)
        self._code = code

    @binding(f"(self: {MODULE}.TritonError) -> str")
    def message(self) -> str:
        return self._message

    @binding(f"(self: {MODULE}.TritonError) -> {MODULE}.TritonError.__ErrorCode")
    def code(self) -> Status:
        return self._code


def require_str(what: str, value: object) -> str:
    """`value` as a str: a str as is, `bytes` decoded as UTF-8 (the original's C++ string
    arguments take both). Raises TypeError for anything else (None included), UnicodeDecodeError
    (a ValueError) for bytes that are not UTF-8."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8")
    raise TypeError(f"{what} must be a str, got {type(value)}")
