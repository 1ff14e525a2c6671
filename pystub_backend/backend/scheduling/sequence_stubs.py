"""What the sequence batcher tells its stubs about sequences, and what it hears back: one object per
batcher (`StubSequences`) holds all of it.

    to a stub    SequenceEvicted, SequenceDropRescheduled: sent at once when its queue has room;
                 otherwise from a task (bounded by the stub timeout) that the lane's next batch
                 and the batcher's stop wait for (`flush`), so a frame never overtakes the EXECUTE
                 after it and the model hears of every eviction before FINALIZE
    from a stub  SequenceRescheduled (iterative_sequence): the model rescheduled requests of the
                 batch that is running; `rescheduled` marks them, and the batcher queues them
                 again when the batch ends. A model that is not an iterative sequence model cannot
                 be rescheduled: its request ends with NOT_ITERATIVE.

The frame handler (features/sequence_frames.py) calls `rescheduled(stub, rids)`, which finds the
stub's batcher through the server core the stub belongs to: no module-level state.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pystub_backend.ipc.channel import ChannelClosedError, ChannelTimeoutError
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.messages.sequences import SequenceDropRescheduled
from pystub_backend.ipc.status import Status

if TYPE_CHECKING:
    from pystub_backend.backend.scheduling.sequence_slots import SeqItem
    from pystub_backend.backend.supervision.stub_process import StubProcess

__all__ = ["StubSequences", "rescheduled", "NOT_ITERATIVE"]

log = logging.getLogger("pystub.scheduler")

NOT_ITERATIVE = ("Failed to reschedule the request of model '{model}': request rescheduling requires "
                 "'sequence_batching {{ iterative_sequence: true }}' in the model configuration. The request "
                 "was released.")


class StubSequences:
    """The sequence state a batcher shares with its stubs: the frames on their way to each stub,
    the requests of the batches running there, and which of them the model rescheduled."""

    def __init__(self, model: str, iterative: bool) -> None:
        self.model = model
        self.iterative = iterative
        self._last_send: weakref.WeakKeyDictionary[StubProcess, asyncio.Task[None]] = weakref.WeakKeyDictionary()
        self._running: dict[int, SeqItem] = {}  # id(request) -> item, while its batch runs

    # -- frames to a stub --------------------------------------------------------------------------
    def send(self, stub: StubProcess, message: Any) -> None:
        """Send a small frame to `stub` in order with the frames after it; never blocks."""
        channel = stub.channel
        if channel is None or channel.closed:
            return
        frame = msg.encode(message)
        previous = self._last_send.get(stub)
        if previous is None or previous.done():
            try:
                if channel.try_send(frame):
                    return
            except ChannelClosedError:
                return
            previous = None
        self._last_send[stub] = asyncio.ensure_future(_send_later(stub, frame, type(message).__name__, previous))

    async def flush(self, stub: StubProcess) -> None:
        """Wait until every frame `send` queued for `stub` has been sent (or given up); returns at
        once in the usual case, where they went out immediately."""
        last = self._last_send.get(stub)
        if last is not None and not last.done():
            await asyncio.wait({last})

    def drop(self, stub: StubProcess, rids: list[int], status: Status, text: str) -> None:
        """End rescheduled requests that will not run again: the stub answers them with `text`."""
        self.send(stub, SequenceDropRescheduled(rids, [int(status), text]))

    # -- rescheduling ---------------------------------------------------------------------------------
    def batch_started(self, batch: Iterable[SeqItem]) -> None:
        for item in batch:
            item.rescheduled_rid = None
            self._running[id(item.request)] = item

    def batch_ended(self, batch: Iterable[SeqItem]) -> None:
        for item in batch:
            self._running.pop(id(item.request), None)

    def on_rescheduled(self, stub: StubProcess, rids: list[int]) -> None:
        """The model rescheduled `rids` of the running batch: mark them (they run again), refuse
        those that cannot be."""
        refused = []
        for rid in rids:
            request = stub.reschedule(rid)
            if request is None:
                continue  # no longer in flight (failed meanwhile)
            item = self._running.get(id(request)) if self.iterative else None
            if item is None:
                refused.append(rid)
            else:
                item.rescheduled_rid = rid
        if refused:
            text = NOT_ITERATIVE.format(model=stub.model_name)
            log.error("%s", text)
            self.drop(stub, refused, Status.INTERNAL, text)


async def _send_later(stub: StubProcess, frame: bytes, what: str, previous: asyncio.Task[None] | None) -> None:
    if previous is not None:
        await asyncio.wait({previous})  # keep the frames in the order they were sent
    channel = stub.channel
    if channel is None:
        return
    try:
        await channel.send(frame, stub.settings.stub_timeout_seconds, what)
    except (ChannelClosedError, ChannelTimeoutError) as exc:
        log.warning("stub '%s': could not send %s: %s", stub.instance_name, what, exc)


def _owner(stub: StubProcess) -> StubSequences | None:
    """The StubSequences of the batcher whose instance runs on `stub` (None: no sequence batcher)."""
    core = stub.context
    for version in core.model_versions() if core is not None else ():
        if any(instance.stub is stub for instance in version.instances):
            return getattr(version.scheduler, "sequences", None)
    return None


def rescheduled(stub: StubProcess, rids: list[int]) -> None:
    """A SequenceRescheduled frame from `stub` (before the batch's EXECUTE_DONE). A model without
    a sequence batcher cannot be rescheduled: a StubSequences of none refuses every request."""
    owner = _owner(stub) or StubSequences(stub.model_name, iterative=False)
    owner.on_rescheduled(stub, rids)
