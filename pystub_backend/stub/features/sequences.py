"""The stub's side of sequence batching: the model's `sequence_evicted` hook, and rescheduled
requests (pystub_backend/ipc/messages/sequences.py).

`sequence_evicted(self, correlation_id, reason)` (optional, sync or `async def`) runs on the main
thread, in order with EXECUTE frames, so it never overlaps the model's `execute` (an async hook
runs to completion on the instance loop). The execute deadline (EXECUTE_TIMEOUT_SECONDS) covers
it. An exception is logged with its traceback and changes nothing else.

Rescheduled requests are kept by the stub itself (stub/rescheduled.py); when the backend drops
them (SequenceDropRescheduled), each ends here with the backend's error.
"""

from __future__ import annotations

import inspect
from typing import Any

from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.messages.sequences import SequenceDropRescheduled, SequenceEvicted
from pystub_backend.ipc.records import WireResponse, error_to_wire
from pystub_backend.stub.event_loop import unwrap
from pystub_backend.stub.executor import format_traceback
from pystub_backend.stub.handlers import StubHandlers

__all__ = ["register", "HOOK_NAME"]

HOOK_NAME = "sequence_evicted"


def _on_evicted(stub: Any, message: SequenceEvicted) -> None:
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


def _on_drop(stub: Any, message: SequenceDropRescheduled) -> None:
    """The backend will not run these rescheduled requests again: end each with the error."""
    code, text = message.error
    for rid in stub.rescheduled.drop(message.rids, stub.requests.close):
        stub.send(msg.Response(WireResponse(rid, msg.RESPONSE_FINAL, error_to_wire(int(code), str(text)), [], "{}")))


def register(handlers: StubHandlers) -> None:
    """Wire sequence batching into a stub: the eviction hook and dropped rescheduled requests."""
    handlers.on_main(SequenceEvicted, _on_evicted)
    handlers.on_main(SequenceDropRescheduled, _on_drop)
