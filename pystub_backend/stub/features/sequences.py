"""The stub's side of sequence batching: the model's `sequence_evicted` hook, and rescheduled
requests (pystub_backend/ipc/messages/sequences.py).

`sequence_evicted(self, correlation_id, reason)` (optional, sync or `async def`) runs on the main
thread, in order with EXECUTE frames, so it never overlaps the model's `execute` (an async hook
runs to completion on the instance loop). The execute deadline (EXECUTE_TIMEOUT_SECONDS) covers
it. An exception is logged with its traceback and changes nothing else.

Rescheduling (`request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`): once a batch's
`execute` returned, the requests the model rescheduled (and did not close with a final response)
are kept by the stub's one `RescheduledRequests` and reported in one SequenceRescheduled frame,
before the batch's EXECUTE_DONE. When the backend sends such a request again, `take` hands the
same `InferenceRequest` to the next `execute`, its release flags back to RELEASE_ALL.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.messages.sequences import SequenceDropRescheduled, SequenceEvicted, SequenceRescheduled
from pystub_backend.ipc.records import WireResponse, error_to_wire
from pystub_backend.stub.event_loop import unwrap
from pystub_backend.stub.executor import RELEASE_RESCHEDULE, format_traceback
from pystub_backend.stub.handlers import StubHandlers

if TYPE_CHECKING:
    from pystub_backend.stub.senders import RequestState
    from pystub_backend.stub.stub import Stub

__all__ = ["RescheduledRequests", "register", "HOOK_NAME"]

HOOK_NAME = "sequence_evicted"
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


def report_rescheduled(stub: Stub, requests: list[Any], states: list[RequestState]) -> None:
    """Keep the requests of a finished batch that the model rescheduled, and tell the backend."""
    rids = stub.rescheduled.keep(requests, states)
    if rids:
        stub.send(SequenceRescheduled(rids))


def _on_evicted(stub: Stub, message: SequenceEvicted) -> None:
    hook = getattr(stub.model, HOOK_NAME, None)
    if not callable(hook):
        return
    stub.control.execute_started()
    try:
        result = hook(message.correlation_id, message.reason)
        if inspect.isawaitable(result):
            stub.loop.submit(_await(result)).result()
    except BaseException as exc:  # noqa: BLE001 - the model's bug (sys.exit() too): logged, never fatal
        exc = unwrap(exc)
        stub.log_error(f"{HOOK_NAME}({message.correlation_id!r}, {message.reason!r}) of model '{stub.instance}' "
                       f"raised {type(exc).__name__}: {exc}\n{format_traceback(exc)}")
    finally:
        stub.control.execute_finished()


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _on_drop(stub: Stub, message: SequenceDropRescheduled) -> None:
    """The backend will not run these rescheduled requests again: end each with the error."""
    code, text = message.error
    for rid in stub.rescheduled.drop(message.rids, stub.requests.close):
        stub.send(msg.Response(WireResponse(rid, msg.RESPONSE_FINAL, error_to_wire(int(code), str(text)), [], "{}")))


def register(handlers: StubHandlers) -> None:
    """Wire sequence batching into a stub: the eviction hook and dropped rescheduled requests."""
    handlers.on_main(SequenceEvicted, _on_evicted)
    handlers.on_main(SequenceDropRescheduled, _on_drop)
