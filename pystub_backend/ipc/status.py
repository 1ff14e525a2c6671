"""Status codes shared by the backend and the stub.

The numbering is pb_utils' `TritonError` numbering (docs/reference/model-api.md#errors), so a code raised by a model
in the stub crosses the process boundary as a plain int and means the same thing on the other side.
"""

from __future__ import annotations

import enum

__all__ = ["Status"]


class Status(enum.IntEnum):
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    @classmethod
    def coerce(cls, value: int) -> Status:
        """The status for `value`, or INTERNAL when the value is not a known code."""
        try:
            return cls(int(value))
        except (ValueError, TypeError):
            return cls.INTERNAL
