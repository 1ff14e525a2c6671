"""The stub's side of sequence batching: the model's `sequence_evicted` hook, and rescheduled
requests (pystub_backend/ipc/messages/sequences.py).

`sequence_evicted(self, correlation_id, reason)` (optional, sync or `async def`) runs on the main
thread, in order with EXECUTE frames, so it never overlaps the model's `execute` (an async hook
runs to completion on the instance loop). The execute deadline (EXECUTE_TIMEOUT_SECONDS) covers
it. An exception is logged with its traceback and changes nothing else.

Rescheduling (`request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`): once a batch's
`execute` returned, the requests the model rescheduled (and did not close with a final response)
are kept here with their senders and reported in one SequenceRescheduled frame, before the batch's
EXECUTE_DONE. When the backend sends such a request again, `take_rescheduled` hands the same
`InferenceRequest` to the next `execute`, its release flags back to RELEASE_ALL.
"""

from __future__ import annotations

import inspect
from typing import Any

from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.messages.sequences import SequenceDropRescheduled, SequenceEvicted, SequenceRescheduled
from pystub_backend.stub.executor import RELEASE_RESCHEDULE, format_traceback
from pystub_backend.stub.handlers import on_main
from pystub_backend.stub.translate import error_to_wire

__all__ = ["take_rescheduled", "keep_rescheduled", "HOOK_NAME"]

HOOK_NAME = "sequence_evicted"
_RELEASE_ALL = 1
_KEPT: dict[int, tuple[Any, Any]] = {}  # rid -> (InferenceRequest, RequestState); main thread only


@on_main(SequenceEvicted)
def _on_evicted(stub: Any, message: SequenceEvicted) -> None:
    hook = getattr(stub.model, HOOK_NAME, None)
    if not callable(hook):
        return
    stub.control.execute_started()
    try:
        result = hook(message.correlation_id, message.reason)
        if inspect.isawaitable(result):
            stub.loop.submit(_await(result)).result()
    except Exception as exc:  # the model's bug: logged, never fatal
        stub.log_error(f"{HOOK_NAME}({message.correlation_id!r}, {message.reason!r}) of model '{stub.instance}' "
                       f"raised {type(exc).__name__}: {exc}\n{format_traceback(exc)}")
    finally:
        stub.control.execute_finished()


async def _await(awaitable: Any) -> Any:
    return await awaitable


def take_rescheduled(rid: int) -> tuple[Any, Any] | None:
    """The kept `(request, state)` of a rescheduled request the backend sent again, or None."""
    kept = _KEPT.pop(rid, None)
    if kept is not None:
        kept[0]._release_flags = _RELEASE_ALL
    return kept


def keep_rescheduled(stub: Any, requests: list[Any], states: list[Any]) -> None:
    """After a batch's `execute` returned: keep and report the requests the model rescheduled."""
    rids = []
    for request, state in zip(requests, states, strict=True):
        if getattr(request, "_release_flags", _RELEASE_ALL) == RELEASE_RESCHEDULE and not state.final:
            _KEPT[state.rid] = (request, state)
            rids.append(state.rid)
    if rids:
        stub.send(SequenceRescheduled(rids))


@on_main(SequenceDropRescheduled)
def _on_drop(stub: Any, message: SequenceDropRescheduled) -> None:
    """The backend will not run these rescheduled requests again: end each with the error."""
    code, text = message.error
    for rid in message.rids:
        kept = _KEPT.pop(rid, None)
        if kept is None or kept[1].final:
            continue
        stub.requests.close(kept[1])
        stub.send(msg.Response([rid, msg.RESPONSE_FINAL, error_to_wire(int(code), str(text)), [], "{}"]))
