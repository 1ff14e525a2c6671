"""The sequence batcher: stateful models, one slot per live sequence, eviction the model sees.

    schedule ──▶ admit: correlation id + flags (sequence_controls), control inputs appended,
                 the sequence found or started (a slot, else the backlog), the client link watched
             ──▶ Sequence.queue ──kick──▶ the lane of its instance forms a batch (direct / oldest,
                 sequence_slots) ──▶ instance.submit(batch): one batch per lane at a time,
                 so every request of a sequence runs on the same instance, in order
             ──▶ after the batch: a rescheduled request (iterative_sequence) goes back to the head
                 of its sequence; an executed END frees the slot; an empty sequence starts idling

    a model update: an added instance's lane takes the backlog's oldest sequences; a removed one's
    lane starts no sequence and ends the ones it holds (`_drain`), then its worker ends

    eviction (a sequence ends without END): idle longer than max_sequence_idle_microseconds,
    its client went away (client_link), one of its requests was cancelled, the model unloads.
    The slot is freed at once (the backlog's head takes it), queued requests fail, and the stub
    that holds the sequence's state gets SequenceEvicted: the model's `sequence_evicted(
    correlation_id, reason)` runs there, after the execute that may be running.

Same face as the other schedulers (pystub_backend.backend.scheduling.choice). Everything runs on the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
import time
from collections.abc import Sequence as Listing
from typing import Any

from pystub_backend.backend import client_link
from pystub_backend.backend.config.model_config import ModelConfig
from pystub_backend.backend.config.sequence_controls import Controls, admitted_fields
from pystub_backend.backend.delay_hooks import delay_hooks
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest
from pystub_backend.backend.response_stream import Outcome, ResponseStream
from pystub_backend.backend.scheduling.base import Instance, StubInstance, WorkerScheduler
from pystub_backend.backend.scheduling.implicit_state import ImplicitState
from pystub_backend.backend.scheduling.request_queue import BatchLimits
from pystub_backend.backend.scheduling.sequence_slots import (
    Lane,
    SeqItem,
    Sequence,
    SlotTable,
    direct_batch,
    oldest_batch,
)
from pystub_backend.backend.scheduling.sequence_stubs import StubSequences
from pystub_backend.backend.telemetry.statistics import BACKEND, CANCELED, OTHER, ModelStatistics
from pystub_backend.ipc.messages.sequences import SequenceEvicted
from pystub_backend.ipc.status import Status

__all__ = ["SequenceBatcher"]

log = logging.getLogger("pystub.scheduler")

_CANCELLED_REASONS = ("client_disconnected", "cancelled")
_HOLD_POLL_S = 0.01  # TRITONSERVER_DELAY_SCHEDULER: as often as Triton's batcher threads look


class SequenceBatcher(WorkerScheduler[Lane, list[SeqItem]]):
    def __init__(self, instances: Listing[StubInstance], stats: ModelStatistics, config: ModelConfig) -> None:
        super().__init__(stats)
        self._model = config.name
        self._controls = Controls.from_config(config)
        sequence = config.sequence_batching
        self._iterative = bool(sequence.iterative_sequence)
        self.sequences = StubSequences(config.name, self._iterative)  # what the stubs and we share
        self._idle_ns = int(sequence.max_sequence_idle_microseconds) * 1000
        batching = max(1, int(config.max_batch_size))
        self._oldest = sequence.HasField("oldest")
        if self._oldest:
            oldest = sequence.oldest
            slots = int(oldest.max_candidate_sequences) or batching
            preferred = tuple(sorted({int(s) for s in oldest.preferred_batch_size if 0 < s <= batching}))
            self._limits = BatchLimits(int(config.max_batch_size), preferred,
                                       int(oldest.max_queue_delay_microseconds) * 1000)
        else:
            slots = batching
            self._delay_ns = int(sequence.direct.max_queue_delay_microseconds) * 1000
            self._min_ready = max(1, math.ceil(float(sequence.direct.minimum_slot_utilization) * slots))
        self._slots = slots  # per lane
        self._table = SlotTable([Lane(i, instance, slots) for i, instance in enumerate(instances)])
        self._wakeups: dict[Lane, asyncio.Event] = {}
        self._drained: dict[Lane, asyncio.Event] = {}  # lanes of removed instances, set once empty
        self._anonymous = itertools.count(1)  # ids of requests without a correlation id (iterative)
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_timer_ns = 0
        self._loop: Any = None
        self._closed: ServerError | None = None  # fail_queued or stop: no new sequence work
        self.implicit_state: ImplicitState | None = None  # set by ModelVersion.load (sequence_batching.state)
        self._hold = delay_hooks().queue_hold()  # TRITONSERVER_DELAY_SCHEDULER, a test hook

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for lane in self._table.lanes:
            self._wakeups[lane] = asyncio.Event()
        super().start()

    @property
    def queued(self) -> int:
        return self._table.queued()

    # -- callers ---------------------------------------------------------------------------------
    async def schedule(self, request: InferRequest, batch_size: int) -> Any:
        """The request's InferResponse. Raises ServerError."""
        item = self._admit(request, batch_size)
        stream = await self._dispatched(item)
        try:
            return await stream.single()
        except asyncio.CancelledError:
            stream.cancel()
            self._abandon(item)
            raise

    async def schedule_stream(self, request: InferRequest, batch_size: int) -> ResponseStream:
        """The request's ResponseStream, once its execute has run. Raises ServerError."""
        return await self._dispatched(self._admit(request, batch_size))

    async def _dispatched(self, item: SeqItem) -> ResponseStream:
        try:
            result = await item.future
        except asyncio.CancelledError:
            self._abandon(item)
            raise
        if isinstance(result, ServerError):
            raise result
        return result

    def _admit(self, request: InferRequest, batch_size: int) -> SeqItem:
        """Check the request, attach its sequence fields and control inputs, queue it. Raises
        ServerError with Triton's texts."""
        if self._closed is not None:
            raise self._closed
        fields, cid, shown = admitted_fields(request.parameters, self._model, batch_size,
                                             self._anonymous if self._iterative else None)
        sequence = self._table.find(cid)
        if sequence is None and not fields.start:
            raise ServerError(f"inference request for sequence {cid} to model '{self._model}' must specify the "
                              f"START flag on the first request of the sequence", Status.INVALID_ARG)
        request.inputs.extend(self._controls.tensors(shown, self._model))
        if self.implicit_state is not None:  # implicit state hook: the state inputs, as Triton gives them
            request.inputs.extend(self.implicit_state.tensors())
        request.correlation_id, request.flags = shown.correlation_id, shown.flags
        if sequence is None:
            sequence = self._table.start(cid)
        elif fields.start:
            log.warning("sequence %s of model '%s' got a new START before its END: the sequence restarts (the "
                        "model sees the START flag again)", cid, self._model)
        item = SeqItem(request, fields, sequence, self._loop.create_future(), time.monotonic_ns())
        sequence.queue.append(item)
        sequence.idle_since_ns = None
        self._follow_client(sequence)
        if fields.end:
            self._table.unmap(sequence)  # a later request with this id must START a new sequence
        self._wake(sequence.lane)
        return item

    def _follow_client(self, sequence: Sequence) -> None:
        """Evict the sequence if the client of its latest request goes away."""
        link = client_link.current()
        if link is sequence.link:
            return
        if sequence.link is not None:
            sequence.link.unwatch(sequence)
        sequence.link = link
        if link is not None:
            link.watch(sequence, functools.partial(self._client_gone, sequence))

    def _client_gone(self, sequence: Sequence) -> None:
        self._evict(sequence, "client_disconnected")

    def _abandon(self, item: SeqItem) -> None:
        """A request's caller was cancelled: cancelling one request cancels its sequence."""
        if item in item.sequence.queue:  # never executed (a running one is counted when it ends)
            self._record_failure(item.enqueued_ns, CANCELED)
        if not item.future.done():
            item.future.cancel()
        self._evict(item.sequence, "cancelled")

    # -- lanes -----------------------------------------------------------------------------------
    def _wake(self, lane: Lane | None) -> None:
        if lane is not None and lane in self._wakeups:
            self._wakeups[lane].set()

    # -- the policy: one lane per instance, one batch of its sequences at a time ---------------------
    def _units(self) -> Listing[Lane]:
        return self._table.lanes

    def _instance_of(self, unit: Lane) -> Instance:
        return unit.instance

    def _can_run(self, instance: Instance) -> bool:
        return instance.healthy  # its sequences' state is on this instance: no other can run them

    def _give_back(self, unit: Lane, work: list[SeqItem]) -> None:
        for item in reversed(work):  # it died while we waited: the batch waits for its return
            item.sequence.running = None
            item.sequence.queue.appendleft(item)

    async def _take(self, unit: Lane) -> list[SeqItem]:
        return await self._next_batch(unit)

    async def _next_batch(self, lane: Lane) -> list[SeqItem]:
        wakeup = self._wakeups[lane]
        while True:
            wakeup.clear()
            if self._hold is not None and self._hold.holds(self._table.queued()):
                await asyncio.sleep(_HOLD_POLL_S)  # the test hook counts every lane's requests: look again
                continue
            now = time.monotonic_ns()
            if self._oldest:
                items, wake = oldest_batch(lane, now, self._limits)
            else:
                items, wake = direct_batch(lane, now, self._delay_ns, self._min_ready)
            items = [item for item in items if self._still_held(lane, item.sequence)]
            if items:
                for item in items:
                    item.sequence.queue.popleft()
                    item.sequence.running = item
                return items
            try:
                await asyncio.wait_for(wakeup.wait(), None if wake is None else max(0.0, (wake - now) / 1e9))
            except asyncio.TimeoutError:
                pass

    def _still_held(self, lane: Lane, sequence: Sequence) -> bool:
        """False (and the sequence dropped) when the stub that held its state is gone."""
        if sequence.stub is None or sequence.stub is lane.instance.stub:
            return True
        self._drop(sequence, ServerError(
            f"sequence {sequence.correlation_id} of model '{self._model}' was lost: the stub process that held its "
            f"state restarted. Start the sequence again.", Status.UNAVAILABLE), BACKEND)
        return False

    async def _run(self, lane: Lane, batch: list[SeqItem]) -> None:
        stub = lane.instance.stub
        if stub is not None:
            await self.sequences.flush(stub)  # evictions go before the requests after them
        for item in batch:
            item.sequence.stub = stub  # from now on this stub holds the sequence's state
        self.sequences.batch_started(stub, batch)
        try:
            results = await self._execute(lane.instance, batch, lambda sent: self._sent(batch, sent),
                                          lambda item: item.stream is None)  # type: ignore[attr-defined]
        finally:
            self.sequences.batch_ended(batch)
        for item, result in zip(batch, results, strict=True):
            self._after(item, result)

    def _sent(self, batch: list[SeqItem], results: list[Outcome]) -> None:
        """The batch is on its way: an eviction may now cancel a request while the model runs it."""
        for item, result in zip(batch, results, strict=True):
            item.sent = None if isinstance(result, ServerError) else result
            if item.sent is not None and self.implicit_state is not None:  # implicit state hook
                item.sent.on_put = self.implicit_state.hide_outputs  # the client never sees state outputs

    def _after(self, item: SeqItem, result: Outcome) -> None:
        sequence = item.sequence
        sequence.running = None
        item.sent = None
        if isinstance(result, ServerError):  # it never reached the model (counted)
            if not item.future.done():
                item.future.set_result(result)
        elif item.stream is None:
            item.stream = result
            if not item.future.done():
                item.future.set_result(result)
            elif not result.finished:
                result.cancel()  # nobody waits for it any more
        if item.rescheduled_rid is not None:
            if sequence.evicted or self._closed is not None or item.stream is None or item.stream.finished:
                self._drop_rescheduled(item, self._closed or self._evicted_error(sequence, "cancelled"))
            else:
                sequence.queue.appendleft(item)  # runs again before the sequence's later requests
                self._wake(sequence.lane)
            return
        if sequence.evicted:
            return
        if item.fields.end:
            self._release(sequence)
        elif not sequence.queue:
            self._start_idling(sequence)

    def _fail(self, item: SeqItem, error: ServerError, reason: str) -> None:
        if not item.future.done():
            self._record_failure(item.enqueued_ns, reason)
            item.future.set_result(error)

    def _drop_rescheduled(self, item: SeqItem, error: ServerError) -> None:
        """End a rescheduled request that will not run again: its stub answers it with `error`."""
        stub, rid = item.sequence.stub, item.rescheduled_rid
        item.rescheduled_rid = None
        if stub is not None and rid is not None:
            self.sequences.drop(stub, [rid], error.status, error.message)

    def _release(self, sequence: Sequence) -> None:
        """The sequence ended (END executed) or was evicted: free its slot for the backlog."""
        if sequence.link is not None:
            sequence.link.unwatch(sequence)
            sequence.link = None
        lane = sequence.lane
        promoted = self._table.release(sequence)
        if promoted is not None:
            self._wake(promoted.lane)
        if lane is not None and lane.draining and not lane.sequences():
            self._drained[lane].set()

    def _instance_gone(self, unit: Lane) -> None:
        self._lane_failed(unit)

    def _lane_failed(self, lane: Lane) -> None:
        """The instance is FAILED for good: its sequences are lost, the backlog goes elsewhere."""
        lane.dead = True
        error = lane.instance.unhealthy_error()
        for sequence in lane.sequences():
            self._drop(sequence, error, BACKEND)
        if all(other.dead or other.draining for other in self._table.lanes):
            for sequence in list(self._table.backlog):
                self._drop(sequence, error, BACKEND)

    # -- instances added and removed by a model update ----------------------------------------------
    def _add_units(self, instances: Listing[Instance]) -> Listing[Lane]:
        """A lane per added instance; the backlog's oldest sequences take its slots at once."""
        first = max((lane.index for lane in self._table.lanes), default=-1) + 1
        lanes = [Lane(first + number, instance, self._slots)  # type: ignore[arg-type]  # StubInstances
                 for number, instance in enumerate(instances)]
        for lane in lanes:
            self._wakeups[lane] = asyncio.Event()
            for sequence in self._table.add_lane(lane):
                self._wake(sequence.lane)
        return lanes

    async def _drain(self, instance: Instance) -> None:
        """The instance's lane takes no new sequence; the ones it holds run on there until they end
        (END, idle eviction, their client gone), as on Triton 2.51."""
        lane = self._lane_of(instance)
        if lane is None:
            return
        lane.draining = True
        drained = self._drained[lane] = asyncio.Event()
        if lane.sequences():
            log.info("model '%s': instance '%s' was removed; it ends its %d sequence(s) first", self._model,
                     lane.instance.name, len(lane.sequences()))
            await drained.wait()

    def _forget(self, instance: Instance) -> None:
        lane = self._lane_of(instance)
        if lane is not None:
            self._table.remove_lane(lane)
            self._wakeups.pop(lane, None)
            self._drained.pop(lane, None)

    def _lane_of(self, instance: Instance) -> Lane | None:
        return next((lane for lane in self._table.lanes if lane.instance is instance), None)

    # -- idle sequences ----------------------------------------------------------------------------
    def _start_idling(self, sequence: Sequence) -> None:
        now = time.monotonic_ns()
        sequence.idle_since_ns = now
        self._arm_idle(now + self._idle_ns, now)

    def _arm_idle(self, deadline_ns: int, now_ns: int) -> None:
        if self._idle_timer is not None:
            if self._idle_timer_ns <= deadline_ns:
                return
            self._idle_timer.cancel()
        self._idle_timer_ns = deadline_ns
        self._idle_timer = self._loop.call_later(max(0, deadline_ns - now_ns) / 1e9, self._reap)

    def _reap(self) -> None:
        self._idle_timer = None
        now = time.monotonic_ns()
        next_deadline = None
        for sequence in [s for lane in self._table.lanes for s in lane.sequences()]:
            if sequence.idle_since_ns is None or sequence.queue or sequence.running is not None:
                continue
            deadline = sequence.idle_since_ns + self._idle_ns
            if deadline <= now:
                self._evict(sequence, "idle_timeout")
            elif next_deadline is None or deadline < next_deadline:
                next_deadline = deadline
        if next_deadline is not None:
            self._arm_idle(next_deadline, now)

    # -- eviction ----------------------------------------------------------------------------------
    def _evicted_error(self, sequence: Sequence, reason: str) -> ServerError:
        status = Status.CANCELLED if reason in _CANCELLED_REASONS else Status.UNAVAILABLE
        return ServerError(f"sequence {sequence.correlation_id} of model '{self._model}' was evicted ({reason}); "
                           f"the request was not executed.", status)

    def _evict(self, sequence: Sequence, reason: str, error: ServerError | None = None) -> int:
        """End a sequence that did not get its END: free its slot, fail what it has queued, tell
        the model (when a stub holds its state). Returns how many queued requests failed."""
        if sequence.evicted:
            return 0
        holder = sequence.stub if sequence.lane is not None and sequence.stub is sequence.lane.instance.stub else None
        failed = self._drop(sequence, error or self._evicted_error(sequence, reason),
                            CANCELED if reason in _CANCELLED_REASONS else OTHER)
        running = sequence.running
        stream = None if running is None else (running.sent or running.stream)
        if stream is not None and reason in _CANCELLED_REASONS:
            stream.cancel()  # the model sees is_cancelled()
        told = holder is not None and holder.alive
        if holder is not None and told:
            self.sequences.send(holder, SequenceEvicted(sequence.correlation_id, reason))
        log.info("sequence %s of model '%s' evicted (%s)%s%s", sequence.correlation_id, self._model, reason,
                 f"; {failed} queued request(s) failed" if failed else "",
                 "" if told else "; no stub holds its state")
        return failed

    def _drop(self, sequence: Sequence, error: ServerError, reason: str) -> int:
        """Forget a sequence: fail its queued requests with `error` (a failure of `reason`), free
        its slot."""
        sequence.evicted = True
        queued, failed = list(sequence.queue), 0
        sequence.queue.clear()
        for item in queued:
            if item.rescheduled_rid is not None:
                self._drop_rescheduled(item, error)
            elif not item.future.done():
                self._fail(item, error, reason)
                failed += 1
        self._release(sequence)
        return failed

    # -- stopping ----------------------------------------------------------------------------------
    def fail_queued(self, error: ServerError) -> int:
        """The model is unloading (or the server stopping): answer queued requests with `error`
        and evict every sequence ("unloading"); batches already sent run on. Returns how many
        requests failed."""
        self._closed = self._closed or error
        return sum(self._evict(sequence, "unloading", error) for sequence in self._table.all_sequences())

    async def _before_workers_stop(self) -> None:
        """The models hear of every eviction before their FINALIZE."""
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        stubs = [lane.instance.stub for lane in self._table.lanes if lane.instance.stub is not None]
        await asyncio.gather(*(self.sequences.flush(stub) for stub in stubs))
