"""The requests a model rescheduled (`request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`)
in an iterative sequence: once a batch's `execute` returned, the requests the model rescheduled (and
did not close with a final response) are kept by the stub's one `RescheduledRequests` and reported
in one SequenceRescheduled frame, before the batch's EXECUTE_DONE. When the backend sends such a
request again, `take` hands the same `InferenceRequest` to the next `execute`, its release flags
back to RELEASE_ALL. The backend's SequenceDropRescheduled is handled by features/sequences.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pystub_backend.ipc.messages.sequences import SequenceRescheduled
from pystub_backend.stub.executor import RELEASE_RESCHEDULE

if TYPE_CHECKING:
    from pystub_backend.stub.senders import RequestState

__all__ = ["RescheduledRequests", "report_rescheduled"]

_RELEASE_ALL = 1


class RescheduledRequests:
    """The requests a model rescheduled, kept open until the backend sends them again or drops
    them. Used on the stub's main thread only (EXECUTE and the sequence frames run there)."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[Any, RequestState]] = {}  # rid -> (InferenceRequest, its state)

    def __len__(self) -> int:
        return len(self._kept)

    def take(self, rid: int) -> tuple[Any, RequestState] | None:
        """The kept `(request, state)` of a rescheduled request the backend sent again, or None."""
        kept = self._kept.pop(rid, None)
        if kept is not None:
            kept[0]._release_flags = _RELEASE_ALL
        return kept

    def keep(self, requests: list[Any], states: list[RequestState]) -> list[int]:
        """After a batch's `execute` returned: keep the requests the model rescheduled and return
        their rids (the caller reports them before EXECUTE_DONE)."""
        rids = []
        for request, state in zip(requests, states, strict=True):
            if getattr(request, "_release_flags", _RELEASE_ALL) == RELEASE_RESCHEDULE and not state.final:
                self._kept[state.rid] = (request, state)
                rids.append(state.rid)
        return rids

    def drop(self, rids: list[int], close: Callable[[RequestState], None]) -> list[int]:
        """Forget these rescheduled requests, `close` the state of each still open; returns the rids
        that were open (each needs its final error response)."""
        dropped = []
        for rid in rids:
            kept = self._kept.pop(rid, None)
            if kept is None or kept[1].final:
                continue
            close(kept[1])
            dropped.append(rid)
        return dropped


def report_rescheduled(stub: Any, requests: list[Any], states: list[RequestState]) -> None:
    """Keep the requests of a finished batch that the model rescheduled, and tell the backend."""
    rids = stub.rescheduled.keep(requests, states)
    if rids:
        stub.send(SequenceRescheduled(rids))
