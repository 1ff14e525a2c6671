"""The backend's side of the sequence frames (pystub_backend/ipc/messages/sequences.py).

    to a stub    SequenceEvicted, SequenceDropRescheduled: sent at once when its queue has room;
                 otherwise from a task (bounded by the stub timeout) that the lane's next batch
                 and the batcher's stop wait for, so a frame never overtakes the EXECUTE after it
                 and the model hears of every eviction before FINALIZE
    from a stub  SequenceRescheduled: the model rescheduled requests of the batch that is running;
                 the batcher that sent the batch (`StubProcess.reschedule_owner`) queues them again. A model that is not
                 an iterative sequence model cannot be rescheduled: its request ends with an error.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pystub_backend.ipc.messages.sequences import SequenceDropRescheduled, SequenceEvicted, SequenceRescheduled
from pystub_backend.ipc.records import WireError
from pystub_backend.ipc.status import Status

if TYPE_CHECKING:
    from pystub_backend.backend.supervision.handlers import BackendHandlers
    from pystub_backend.backend.supervision.stub_process import StubProcess

__all__ = ["register", "send_to_stub", "flush", "NOT_ITERATIVE"]

log = logging.getLogger("pystub.scheduler")



NOT_ITERATIVE = ("Failed to reschedule the request of model '{model}': request rescheduling requires "
                 "'sequence_batching {{ iterative_sequence: true }}' in the model configuration. The request "
                 "was released.")


def send_to_stub(stub: StubProcess, message: SequenceDropRescheduled | SequenceEvicted) -> None:
    """Send a small frame to `stub` in order with the frames after it; never blocks
    (StubProcess.send_soon)."""
    stub.send_soon(message)


async def flush(stub: StubProcess) -> None:
    """Wait until every frame `send_to_stub` queued for `stub` has been sent (or given up);
    returns at once in the usual case, where they went out immediately."""
    await stub.flush()


def _on_rescheduled(stub: StubProcess, message: SequenceRescheduled) -> None:
    """Runs before the batch's EXECUTE_DONE: the batcher learns which of its requests run again."""
    owner = stub.reschedule_owner
    refused = []
    for rid in message.rids:
        request = stub.reschedule(rid)
        if request is None:
            continue  # no longer in flight (failed meanwhile)
        if owner is None or not owner.on_rescheduled(request, rid):
            refused.append(rid)
    if refused:
        text = NOT_ITERATIVE.format(model=stub.model_name)
        log.error("%s", text)
        stub.send_soon(SequenceDropRescheduled(refused, WireError(int(Status.INTERNAL), text)))


def register(handlers: BackendHandlers) -> None:
    """SequenceRescheduled from the stubs."""
    handlers.on_frame(SequenceRescheduled, _on_rescheduled)
