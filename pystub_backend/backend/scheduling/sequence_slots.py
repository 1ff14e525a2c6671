"""The sequence batcher's bookkeeping: sequences, the slots of each instance, the backlog, and the
rules that form a batch. No asyncio here (the batcher owns the clock, timers and futures), so
every rule is unit-tested on its own.

    correlation id ──▶ Sequence ──▶ a slot of one Lane (one per model instance) for its whole life
                          │            direct: max_batch_size slots (1 when it is 0)
                          │            oldest: max_candidate_sequences slots
                          └──▶ the backlog, oldest first, when every slot is taken; a freed slot
                               goes to the backlog's head at once

    a batch (per lane, one at a time): at most one request per sequence, the head of its queue
        direct   every ready slot, in slot order, once `min_ready` slots are ready or the oldest
                 head has waited the queue delay
        oldest   the oldest heads first, sized like the dynamic batcher (preferred sizes, cap,
                 queue delay: request_queue.form_batch)

A sequence leaves the id map when its END request arrives (a new START with the same id starts a
new sequence, as in Triton) and frees its slot once that END request has executed and was not
rescheduled, or at once when it is evicted.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Hashable
from typing import TYPE_CHECKING

from pystub_backend.backend.config.sequence_controls import SequenceFields
from pystub_backend.backend.response_stream import ResponseStream
from pystub_backend.backend.scheduling.request_queue import BatchLimits, QueueEntry, form_batch

if TYPE_CHECKING:
    from pystub_backend.backend.client_link import Link
    from pystub_backend.backend.inference import InferRequest
    from pystub_backend.backend.scheduling.base import Outcome, StubInstance
    from pystub_backend.backend.supervision.stub_process import StubProcess

__all__ = ["SeqItem", "Sequence", "Lane", "SlotTable", "direct_batch", "oldest_batch"]


class SeqItem(QueueEntry):
    """A request of a sequence: queued, running, or queued again after the model rescheduled it."""

    __slots__ = ("request", "fields", "sequence", "future", "stream", "sent", "rescheduled_rid")

    def __init__(self, request: InferRequest, fields: SequenceFields, sequence: Sequence,
                 future: asyncio.Future[Outcome], enqueued_ns: int) -> None:
        super().__init__(1, None, enqueued_ns)
        self.request = request
        self.fields = fields
        self.sequence = sequence
        self.future = future  # resolves to the ResponseStream (first dispatch) or a ServerError
        self.stream: ResponseStream | None = None  # once dispatched
        self.sent: ResponseStream | None = None  # while its execute runs (cancellable meanwhile)
        self.rescheduled_rid: int | None = None  # set while the model's reschedule is pending


class Sequence:
    __slots__ = ("correlation_id", "lane", "slot", "queue", "running", "idle_since_ns", "link", "stub",
                 "mapped", "evicted")

    def __init__(self, correlation_id: int | str) -> None:
        self.correlation_id = correlation_id
        self.lane: Lane | None = None  # None while in the backlog (or once its slot is freed)
        self.slot = -1
        self.queue: collections.deque[SeqItem] = collections.deque()
        self.running: SeqItem | None = None
        self.idle_since_ns: int | None = None  # nothing queued or running since then
        self.link: Link | None = None  # the client link of its latest request
        self.stub: StubProcess | None = None  # the stub process that holds its state (it has run there)
        self.mapped = True  # reachable by its id: started, END not yet received
        self.evicted = False

    @property
    def ready(self) -> bool:
        return bool(self.queue) and self.running is None and not self.evicted


class Lane:
    """The slots of one model instance."""

    def __init__(self, index: int, instance: StubInstance, slots: int) -> None:
        self.index = index
        self.instance = instance
        self.slots: list[Sequence | None] = [None] * max(1, slots)
        self.dead = False  # the instance is FAILED: it takes no sequence any more
        self.draining = False  # removed by a model update: its sequences end here, no new one starts

    @property
    def free(self) -> int:
        return 0 if self.dead or self.draining else sum(1 for s in self.slots if s is None)

    def ready(self) -> list[Sequence]:
        return [s for s in self.slots if s is not None and s.ready]

    def sequences(self) -> list[Sequence]:
        return [s for s in self.slots if s is not None]


class SlotTable:
    def __init__(self, lanes: list[Lane]) -> None:
        self.lanes = lanes
        self.live: dict[Hashable, Sequence] = {}
        self.backlog: collections.deque[Sequence] = collections.deque()

    @staticmethod
    def key(correlation_id: int | str) -> Hashable:
        return (type(correlation_id).__name__, correlation_id)  # 1 and "1" are different sequences

    def find(self, correlation_id: int | str) -> Sequence | None:
        return self.live.get(self.key(correlation_id))

    def start(self, correlation_id: int | str) -> Sequence:
        """A new sequence, in the free slot of the lane with the most free slots, else backlogged."""
        sequence = Sequence(correlation_id)
        self.live[self.key(correlation_id)] = sequence
        lane = max(self.lanes, key=lambda candidate: candidate.free, default=None)
        if lane is not None and lane.free:
            self._assign(sequence, lane)
        else:
            self.backlog.append(sequence)
        return sequence

    def _assign(self, sequence: Sequence, lane: Lane) -> None:
        slot = lane.slots.index(None)
        lane.slots[slot] = sequence
        sequence.lane, sequence.slot = lane, slot

    def unmap(self, sequence: Sequence) -> None:
        if sequence.mapped:
            sequence.mapped = False
            key = self.key(sequence.correlation_id)
            if self.live.get(key) is sequence:
                del self.live[key]

    def release(self, sequence: Sequence) -> Sequence | None:
        """Free the sequence's slot (or take it out of the backlog); the backlog's head takes the
        slot. Returns the sequence that got it, if any."""
        self.unmap(sequence)
        lane = sequence.lane
        if lane is None:
            if sequence in self.backlog:
                self.backlog.remove(sequence)
            return None
        lane.slots[sequence.slot] = None
        sequence.lane, sequence.slot = None, -1
        if not lane.free or not self.backlog:
            return None
        promoted = self.backlog.popleft()
        self._assign(promoted, lane)
        return promoted

    def add_lane(self, lane: Lane) -> list[Sequence]:
        """A lane of an instance an update added: the backlog's heads take its slots (returned)."""
        self.lanes.append(lane)
        promoted = []
        while self.backlog and lane.free:
            promoted.append(self.backlog.popleft())
            self._assign(promoted[-1], lane)
        return promoted

    def remove_lane(self, lane: Lane) -> None:
        """A drained lane (no sequence left in it) goes."""
        self.lanes.remove(lane)

    def all_sequences(self) -> list[Sequence]:
        return [s for lane in self.lanes for s in lane.sequences()] + list(self.backlog)

    def queued(self) -> int:
        return sum(len(s.queue) for s in self.all_sequences())


def direct_batch(lane: Lane, now_ns: int, delay_ns: int, min_ready: int) -> tuple[list[SeqItem], int | None]:
    """`(items, wake)`: the heads of the lane's ready slots, in slot order, or none yet and when
    to ask again (None: nothing is ready)."""
    ready = lane.ready()
    if not ready:
        return [], None
    heads = [s.queue[0] for s in ready]
    oldest = min(item.enqueued_ns for item in heads)
    if len(heads) >= min_ready or delay_ns == 0 or now_ns >= oldest + delay_ns:
        return heads, None
    return [], oldest + delay_ns


def oldest_batch(lane: Lane, now_ns: int, limits: BatchLimits) -> tuple[list[SeqItem], int | None]:
    """`(items, wake)`: the oldest heads of the lane's ready sequences, as many as `form_batch`
    takes, or none yet and when to ask again."""
    heads = sorted((s.queue[0] for s in lane.ready()), key=lambda item: item.enqueued_ns)
    count, wake = form_batch(heads, now_ns, limits)
    return heads[:count], wake
