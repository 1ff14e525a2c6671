"""Sequence batching frames (kinds 40-49): eviction the model sees, and request rescheduling.

    backend -> stub                          stub -> backend
    ---------------                          ---------------
    SequenceEvicted (correlation id, reason) SequenceRescheduled (rids the model rescheduled;
    SequenceDropRescheduled (rids, error)      sent before the batch's EXECUTE_DONE)

A rescheduled request (`set_release_flags(RESCHEDULE)`, iterative sequences) stays open on both
sides: the stub keeps its `InferenceRequest` (and sender), the backend keeps its rid, stream and
inputs; a later EXECUTE carries the same wire request again. SequenceDropRescheduled ends such a
request instead (its sequence was evicted, or the model cannot be rescheduled): the stub answers
it with a final error response carrying `[code, message]`.
"""

from __future__ import annotations

from typing import NamedTuple

from pystub_backend.ipc.records import WireError
from pystub_backend.ipc.wire import message

__all__ = ["SequenceEvicted", "SequenceRescheduled", "SequenceDropRescheduled", "EVICTION_REASONS"]

# Why a sequence ended without its END request (the `reason` the model's hook receives).
EVICTION_REASONS = ("idle_timeout", "client_disconnected", "cancelled", "unloading")


@message(40)
class SequenceEvicted(NamedTuple):
    correlation_id: int | str
    reason: str  # one of EVICTION_REASONS


@message(41)
class SequenceRescheduled(NamedTuple):
    rids: list[int]


@message(42)
class SequenceDropRescheduled(NamedTuple):
    rids: list[int]
    error: WireError
