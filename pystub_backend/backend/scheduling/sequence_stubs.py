"""What the sequence batcher tells its stubs about sequences, and what it hears back: one object per
batcher (`StubSequences`) holds the batcher's side of it.

    to a stub    SequenceEvicted, SequenceDropRescheduled: `send` (the stub's `send_soon`: in
                 order with the EXECUTE after it); `flush` before the lane's next batch and the
                 batcher's stop, so the model hears of every eviction before FINALIZE
    from a stub  SequenceRescheduled (iterative_sequence): features/sequence_frames.py hands each
                 rescheduled request to the owner of the stub's running batch (`on_rescheduled`);
                 the batcher queues it again when the batch ends.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from pystub_backend.ipc.messages.sequences import SequenceDropRescheduled
from pystub_backend.ipc.records import WireError
from pystub_backend.ipc.status import Status

if TYPE_CHECKING:
    from pystub_backend.backend.inference import InferRequest
    from pystub_backend.backend.scheduling.sequence_slots import SeqItem
    from pystub_backend.backend.supervision.stub_process import StubProcess

__all__ = ["StubSequences"]


class StubSequences:
    """The sequence state a batcher shares with its stubs: the requests of the batches running
    there, and which of them the model rescheduled."""

    def __init__(self, model: str, iterative: bool) -> None:
        self.model = model
        self.iterative = iterative
        self._running: dict[int, SeqItem] = {}  # id(request) -> item, while its batch runs

    # -- frames to a stub --------------------------------------------------------------------------
    @staticmethod
    def send(stub: StubProcess, message: NamedTuple) -> None:
        """Send a small frame to `stub` in order with the frames after it; never blocks."""
        stub.send_soon(message)

    @staticmethod
    async def flush(stub: StubProcess) -> None:
        """Wait until the frames `send` queued for `stub` are out (at once, usually)."""
        await stub.flush()

    def drop(self, stub: StubProcess, rids: list[int], status: Status, text: str) -> None:
        """End rescheduled requests that will not run again: the stub answers them with `text`."""
        self.send(stub, SequenceDropRescheduled(rids, WireError(int(status), text)))

    # -- rescheduling ---------------------------------------------------------------------------------
    def batch_started(self, stub: StubProcess | None, batch: Iterable[SeqItem]) -> None:
        if stub is not None and self.iterative:
            stub.reschedule_owner = self  # the stub's SequenceRescheduled frames ask us
        for item in batch:
            item.rescheduled_rid = None
            self._running[id(item.request)] = item

    def batch_ended(self, batch: Iterable[SeqItem]) -> None:
        for item in batch:
            self._running.pop(id(item.request), None)

    def on_rescheduled(self, request: InferRequest, rid: int) -> bool:
        """The model rescheduled `request` of the running batch; False when it is not ours."""
        item = self._running.get(id(request))
        if item is None:
            return False
        item.rescheduled_rid = rid
        return True
