"""The backend's side of the sequence frames (pystub_backend/ipc/messages/sequences.py).

    to a stub    SequenceEvicted, SequenceDropRescheduled: sent at once when its queue has room;
                 otherwise from a task (bounded by the stub timeout) that the lane's next batch
                 and the batcher's stop wait for, so a frame never overtakes the EXECUTE after it
                 and the model hears of every eviction before FINALIZE
    from a stub  SequenceRescheduled: the model rescheduled requests of the batch that is running;
                 the batcher that sent the batch (`OWNERS`) queues them again. A model that is not
                 an iterative sequence model cannot be rescheduled: its request ends with an error.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any

from pystub_backend.backend.supervision.handlers import handles
from pystub_backend.ipc.channel import ChannelClosedError, ChannelTimeoutError
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.messages.sequences import SequenceDropRescheduled, SequenceRescheduled
from pystub_backend.ipc.status import Status

__all__ = ["send_to_stub", "flush", "OWNERS", "NOT_ITERATIVE"]

log = logging.getLogger("pystub.scheduler")

# StubProcess -> the iterative sequence batcher whose batches it runs (set before each batch).
OWNERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_LAST_SEND: weakref.WeakKeyDictionary[Any, asyncio.Task[None]] = weakref.WeakKeyDictionary()

NOT_ITERATIVE = ("Failed to reschedule the request of model '{model}': request rescheduling requires "
                 "'sequence_batching {{ iterative_sequence: true }}' in the model configuration. The request "
                 "was released.")


def send_to_stub(stub: Any, message: Any) -> None:
    """Send a small frame to `stub` in order with the frames after it; never blocks."""
    channel = stub.channel
    if channel is None or channel.closed:
        return
    frame = msg.encode(message)
    previous = _LAST_SEND.get(stub)
    if previous is None or previous.done():
        try:
            if channel.try_send(frame):
                return
        except ChannelClosedError:
            return
        previous = None
    _LAST_SEND[stub] = asyncio.ensure_future(_send_later(stub, frame, type(message).__name__, previous))


async def _send_later(stub: Any, frame: bytes, what: str, previous: asyncio.Task[None] | None) -> None:
    if previous is not None:
        await asyncio.wait({previous})  # keep the frames in the order they were sent
    try:
        await stub.channel.send(frame, stub.settings.stub_timeout_seconds, what)
    except (ChannelClosedError, ChannelTimeoutError) as exc:
        log.warning("stub '%s': could not send %s: %s", stub.instance_name, what, exc)


async def flush(stub: Any) -> None:
    """Wait until every frame `send_to_stub` queued for `stub` has been sent (or given up);
    returns at once in the usual case, where they went out immediately."""
    last = _LAST_SEND.get(stub)
    if last is not None and not last.done():
        await asyncio.wait({last})


@handles(SequenceRescheduled)
def _on_rescheduled(stub: Any, message: SequenceRescheduled) -> None:
    """Runs before the batch's EXECUTE_DONE: the batcher learns which of its requests run again."""
    owner = OWNERS.get(stub)
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
        send_to_stub(stub, SequenceDropRescheduled(refused, [int(Status.INTERNAL), text]))
