"""Triton's test hooks: environment variables that delay parts of the server, which Triton's own
test suites and users' CI scripts set to make timing-dependent behaviour deterministic (a batch
that always forms, a client deadline that always passes). pystub reads the same names, with the
meaning Triton 2.51 gives them (found in its binaries, measured against it: docs/test-hooks.md):

    TRITONSERVER_DELAY_SCHEDULER=N      the dynamic batcher and the sequence batcher of every
                                        model hold all requests until N are queued (across the
                                        model's instances), once; then they run as usual
    TRITONSERVER_DELAY_GRPC_PROCESS=ms  every unary gRPC ModelInfer waits ms before it is
                                        handed to the model
    TRITONSERVER_DELAY_GRPC_COMPLETE=ms every response on a gRPC stream is written ms late, one
                                        after the other
    TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC=s   every gRPC call other than inference
                                        (health, metadata, model control, ...) answers s late

A value is read as C's `atoi` reads it (leading digits; anything else, or nothing, is 0: off),
once per process, by the first part that asks (Triton reads each when the part that uses it
starts). A hook that is not set costs nothing on the request path: its user keeps None or 0.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["DelayHooks", "QueueHold", "delay_hooks"]

SCHEDULER = "TRITONSERVER_DELAY_SCHEDULER"
GRPC_PROCESS = "TRITONSERVER_DELAY_GRPC_PROCESS"
GRPC_COMPLETE = "TRITONSERVER_DELAY_GRPC_COMPLETE"
GRPC_OTHER = "TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC"
_LEADING_INTEGER = re.compile(r"\s*([+-]?\d+)")


def _atoi(text: str | None) -> int:
    """C's atoi: the leading integer, 0 when there is none (negative values are taken as 0: off)."""
    match = _LEADING_INTEGER.match(text or "")
    return max(0, int(match.group(1))) if match else 0


@dataclass(frozen=True)
class DelayHooks:
    """The hooks set in one environment (0: off)."""

    scheduler_count: int = 0
    grpc_process_s: float = 0.0
    grpc_complete_s: float = 0.0
    grpc_other_s: float = 0.0

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> DelayHooks:
        return cls(scheduler_count=_atoi(environ.get(SCHEDULER)),
                   grpc_process_s=_atoi(environ.get(GRPC_PROCESS)) / 1000,
                   grpc_complete_s=_atoi(environ.get(GRPC_COMPLETE)) / 1000,
                   grpc_other_s=float(_atoi(environ.get(GRPC_OTHER))))

    def queue_hold(self) -> QueueHold | None:
        """A scheduler's hold, or None when TRITONSERVER_DELAY_SCHEDULER is off."""
        return QueueHold(self.scheduler_count) if self.scheduler_count else None


class QueueHold:
    """TRITONSERVER_DELAY_SCHEDULER for one scheduler: hold until `count` requests are queued,
    then never again (Triton's batcher threads drop the delay once the count is reached)."""

    __slots__ = ("_count",)

    def __init__(self, count: int) -> None:
        self._count = count

    def holds(self, queued: int) -> bool:
        """Whether to keep holding with `queued` requests waiting."""
        if self._count and queued >= self._count:
            self._count = 0
        return self._count > 0


@functools.cache
def delay_hooks() -> DelayHooks:
    """The hooks of this process's environment, read once."""
    return DelayHooks.from_environment(os.environ)
