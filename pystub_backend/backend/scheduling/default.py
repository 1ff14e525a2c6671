"""The default scheduler: one queue per model version, the next free pipeline slot of any instance
takes the oldest request.

It pushes, and has no worker tasks: a request is sent from the task that schedules it when an
instance has a free slot and nothing is queued, else it waits in the queue; every event that
frees a slot (a batch's `execute` returned, an instance came back to READY, a BLS hold ended)
pumps the queue from the event loop's callback. Each instance has `PIPELINE_DEPTH` slots, so while
its stub executes one request the next one's inputs are already in its arena and its EXECUTE frame
in its queue: the IPC round trip overlaps the model's compute instead of adding to it.

An instance whose executes are quick (a running mean under `QUICK_EXECUTE_NS`, as the backend sees
them: from when the stub could start one to its EXECUTE_DONE) gets `DEEP_PIPELINE_DEPTH` slots.
Each send to a stub that has drained its queue wakes a sleeping process, and on a small machine
the wake-up costs more than such a request's work; with more of them queued the stub runs them
back to back and the backend reads their answers in one go. A request sent behind others waits
at most `DEEP_PIPELINE_DEPTH - 1` quick executes that another instance might have run sooner;
an instance that turns slow (or is gated by the rate limiter) is back to `PIPELINE_DEPTH`.

    schedule ──no queue, free slot?──yes──▶ _send (instance.submit, wait=False) ──▶ the stream
                      │ no (or the channel is full)           │
                      ▼                                       ▼ EXECUTE_DONE: _executed (count, free slot)
                   queue ◀──────────────── _pump: a free slot takes the oldest (submit, wait=True)

A slot is free again when the model's `execute` returns, not when the request's last response
arrives: a decoupled model (or an `async def execute`) keeps answering while the next request
runs. An instance with an admission gate (the rate limiter's resources) is sent to from a task
that passes the gate first. The caller gets the request's ResponseStream; `schedule` waits for
its single answer. A model update adds instances (`add_instances`: they pump the queue at once)
and removes them (`remove_instance`: no new request goes to it; it returns once its slots are free).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from collections.abc import Sequence
from typing import Any

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest, InferResponse
from pystub_backend.backend.response_stream import Outcome, ResponseStream
from pystub_backend.backend.scheduling.base import Instance, Scheduler
from pystub_backend.backend.scheduling.pipelined import PIPELINE_DEPTH
from pystub_backend.backend.supervision.exchange import Submission
from pystub_backend.backend.telemetry.statistics import BACKEND, CANCELED, OTHER, BatchTiming, ModelStatistics
from pystub_backend.ipc.status import Status

__all__ = ["DefaultScheduler", "PIPELINE_DEPTH", "DEEP_PIPELINE_DEPTH", "QUICK_EXECUTE_NS"]

log = logging.getLogger("pystub.scheduler")

DEEP_PIPELINE_DEPTH = 8  # slots of an instance whose executes are quick
QUICK_EXECUTE_NS = 250_000  # a running mean of execute times below this is quick


class _Slots:
    """An instance's pipeline slots: how many of its executes run, and how many may (from how long
    they take, as the backend sees them)."""

    __slots__ = ("busy", "depth", "run_ns", "last_end")

    def __init__(self) -> None:
        self.busy = 0  # executes sent and not yet returned (or waiting at the instance's gate)
        self.depth = PIPELINE_DEPTH  # until its executes are seen to be quick: about a dozen of them
        self.run_ns = 4 * QUICK_EXECUTE_NS
        self.last_end = 0

    def executed(self, begun: int, gated: bool) -> None:
        """An execute sent at `begun` returned now. It could start no earlier than the previous
        one's end (the stub runs them in turn): its time is measured from the later of the two."""
        now = time.monotonic_ns()
        start = begun if begun > self.last_end else self.last_end
        self.last_end = now
        self.run_ns = (self.run_ns * 7 + (now - start)) >> 3  # a mean over the last ~8
        self.depth = DEEP_PIPELINE_DEPTH if self.run_ns < QUICK_EXECUTE_NS and not gated else PIPELINE_DEPTH


class _Work:
    """What accounting keeps of a request sent to an instance."""

    __slots__ = ("request", "batch_size", "enqueued_ns")

    def __init__(self, request: InferRequest, batch_size: int) -> None:
        self.request = request
        self.batch_size = batch_size
        self.enqueued_ns = time.monotonic_ns()


class _Pending(_Work):
    """A request waiting in the queue, and the future its caller awaits: its stream (or why it never
    ran), or for a unary request (`answer`) its one response itself, so that its caller wakes once."""

    __slots__ = ("future", "answer", "stream")

    def __init__(self, request: InferRequest, batch_size: int, future: asyncio.Future[Any],
                 answer: bool = False) -> None:
        super().__init__(request, batch_size)
        self.future = future
        self.answer = answer
        self.stream: ResponseStream | None = None  # a unary request's, once sent


class DefaultScheduler(Scheduler):
    def __init__(self, instances: Sequence[Instance], stats: ModelStatistics) -> None:
        super().__init__(stats)
        self._instances = list(instances)
        self._slots: dict[Instance, _Slots] = {instance: _Slots() for instance in self._instances}
        self._queue: collections.deque[_Pending] = collections.deque()
        self._pumping = False
        self._draining: dict[Instance, list[asyncio.Future[None]]] = {}  # removed, executes still running
        for instance in self._instances:
            instance.on_change(self._pump)

    @property
    def queued(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        """Nothing runs until a request comes: there are no workers."""

    async def schedule(self, request: InferRequest, batch_size: int) -> InferResponse:
        """The request's InferResponse. Raises ServerError. Its task wakes once: when the answer is
        in (the stream resolves the future itself, ResponseStream.answer)."""
        if self._stopped is not None:
            raise self._stopped
        answer: asyncio.Future[InferResponse] = asyncio.get_running_loop().create_future()
        pending = None
        stream = self._send_now(request, batch_size)
        if stream is not None:
            stream.answer(answer)
        else:
            pending = self._enqueue(_Pending(request, batch_size, answer, answer=True))
        try:
            return await answer
        except asyncio.CancelledError:
            if answer.done() and not answer.cancelled() and answer.exception() is None:
                answer.result().release()  # answered as the caller was cancelled: nobody will encode it
            stream = stream or (pending.stream if pending is not None else None)
            if stream is not None:
                stream.cancel()  # the client went away: the model sees is_cancelled()
            elif pending is not None:
                self._record_failure(pending.enqueued_ns, CANCELED)  # cancelled while queued
            raise

    async def schedule_stream(self, request: InferRequest, batch_size: int) -> ResponseStream:
        """The request's ResponseStream, once its execute has started. Raises ServerError."""
        if self._stopped is not None:
            raise self._stopped
        stream = self._send_now(request, batch_size)
        if stream is not None:
            return stream
        pending = self._enqueue(_Pending(request, batch_size, asyncio.get_running_loop().create_future()))
        try:
            outcome = await pending.future
        except asyncio.CancelledError:
            if pending.future.done() and not pending.future.cancelled():
                delivered = pending.future.result()
                if isinstance(delivered, ResponseStream):
                    delivered.cancel()  # delivered as the caller was cancelled: nobody will read or cancel it
            else:
                self._record_failure(pending.enqueued_ns, CANCELED)  # cancelled while queued
                pending.future.cancel()
            raise
        if isinstance(outcome, ServerError):
            raise outcome
        return outcome

    def _send_now(self, request: InferRequest, batch_size: int) -> ResponseStream | None:
        """Send from the caller's task when a slot is free: the request's stream, or None when it
        must queue. Raises ServerError for one that could not be sent. The queue is empty
        whenever a slot is free (every freed slot pumps it): only then can a request go at once."""
        instance = None if self._queue else self._free_instance()
        if instance is None or instance.gate is not None:
            return None
        outcome = self._send(instance, _Work(request, batch_size), wait=False)
        if isinstance(outcome, ServerError):
            raise outcome
        return outcome

    def _enqueue(self, pending: _Pending) -> _Pending:
        self._queue.append(pending)
        if len(self._queue) == 1:
            self._pump()  # a free instance behind a gate (or a channel that was full) takes it
        return pending

    # -- slots -------------------------------------------------------------------------------------
    def _free_instance(self) -> Instance | None:
        """The least busy instance with a free slot that can run work now, if any."""
        best, best_busy = None, DEEP_PIPELINE_DEPTH
        all_slots = self._slots
        for instance in self._instances:
            slots = all_slots[instance]
            busy = slots.busy
            # `_can_run`, inline: this runs for every request
            if busy < best_busy and busy < slots.depth and instance.healthy and not instance.held:
                best, best_busy = instance, busy
        return best

    def _pump(self) -> None:
        """Free slots take the oldest queued requests; with no usable instance left, the queue
        fails. Runs from callbacks (never reentered)."""
        if self._pumping:
            return
        self._pumping = True
        try:
            queue = self._queue
            while queue:
                instance = self._free_instance()
                if instance is None:
                    if not any(slots.busy for slots in self._slots.values()) \
                            and not any(other.usable for other in self._instances):
                        self._fail_all_queued(self._instances[0].unhealthy_error() if self._instances else
                                              ServerError("no instances", Status.UNAVAILABLE), BACKEND)
                    return
                pending = queue.popleft()
                if pending.future.done():  # cancelled while it waited
                    continue
                if instance.gate is not None:
                    self._slots[instance].busy += 1
                    task = asyncio.ensure_future(self._through_gate(instance, pending))
                    self._running.add(task)
                    task.add_done_callback(self._running.discard)
                else:
                    self._deliver(pending, self._send(instance, pending, wait=True))
        finally:
            self._pumping = False

    # -- sending -----------------------------------------------------------------------------------
    def _send(self, instance: Instance, work: _Work, wait: bool, taken: bool = False) -> Outcome | None:
        """Submit the request to `instance` now: its outcome; None (nothing kept) when `wait` is
        False and it cannot go now. `taken`: its slot was taken already (the gated way)."""
        if not taken:
            self._slots[instance].busy += 1
        begun = time.monotonic_ns()
        try:
            submission = instance.submit([work.request], wait=wait)
        except Exception as exc:  # a bug below us fails this request, as `_execute` does
            log.exception("scheduler: sending a request to '%s' failed", instance.name)
            submission = Submission([ServerError(f"failed to execute the request: {exc}", Status.INTERNAL)],
                                    BatchTiming(), None)
        if submission is None:
            self._slots[instance].busy -= 1
            return None
        if work.request.trace is not None:
            self._begin([work], begun)
        submission.when_executed(functools.partial(self._executed, instance, work, submission, begun))
        return submission.outcomes[0]

    def _executed(self, instance: Instance, work: _Work, submission: Submission, begun: int) -> None:
        """The request's `execute` returned (or it never reached the model): count it, free the
        slot, and let the queue move."""
        try:
            outcome = submission.outcomes[0]
            if work.request.trace is None and isinstance(outcome, ResponseStream) and outcome.finished \
                    and outcome.error is None and not outcome.cancelled:
                # the usual answer: its final response came with EXECUTE_DONE (no callback to keep)
                enqueued = work.enqueued_ns
                self._stats.record_executed_success(work.batch_size, time.monotonic_ns() - enqueued,
                                                    begun - enqueued, submission.timing)
            else:
                self._finish([work], submission.outcomes, begun, submission.timing)
        finally:
            slots = self._slots[instance]  # (a removed instance's stay until its executes returned)
            slots.busy -= 1
            gate = instance.gate
            if gate is not None:
                gate.leave()
            slots.executed(begun, gate is not None)
            self._pump()
            if self._draining:
                self._slot_freed(instance)

    async def _through_gate(self, instance: Instance, pending: _Pending) -> None:
        gate = instance.gate
        assert gate is not None
        try:
            await gate.enter()
        except asyncio.CancelledError:  # the scheduler stops: the request is failed like queued work
            self._slots[instance].busy -= 1
            if not pending.future.done():
                self._record_failure(pending.enqueued_ns, OTHER)
                self._deliver(pending, self._stopped or ServerError("the scheduler stopped", Status.UNAVAILABLE))
            raise
        if pending.future.done() or not self._can_run(instance):  # cancelled, or the instance died meanwhile
            self._slots[instance].busy -= 1
            gate.leave()
            if not pending.future.done():
                self._queue.appendleft(pending)
            self._pump()
            if self._draining:
                self._slot_freed(instance)
            return
        self._deliver(pending, self._send(instance, pending, wait=True, taken=True))

    @staticmethod
    def _deliver(pending: _Pending, outcome: Outcome | None) -> None:
        """Hand the caller its stream as soon as the request is on its way (so a client that goes
        away cancels it while the model runs), or for a unary request let the stream answer it;
        cancel it when nobody waits any more."""
        if outcome is None:
            outcome = ServerError("the request could not be sent", Status.UNAVAILABLE)
        if pending.future.done():
            if isinstance(outcome, ResponseStream):
                outcome.cancel()
        elif not pending.answer:
            pending.future.set_result(outcome)
        elif isinstance(outcome, ServerError):
            pending.future.set_exception(outcome)
        else:
            pending.stream = outcome
            outcome.answer(pending.future)

    # -- instances added and removed by a model update ----------------------------------------------
    def add_instances(self, instances: Sequence[Instance]) -> None:
        self._instances = [*self._instances, *instances]
        for instance in instances:
            self._slots[instance] = _Slots()
            instance.on_change(self._pump)
        self._pump()  # queued requests may go to them at once

    async def remove_instance(self, instance: Instance) -> None:
        """No request is sent to `instance` from now on (the queue is everyone's: the others take
        it); returns once the executes running on it (or waiting at its gate) have returned."""
        self._instances = [other for other in self._instances if other is not instance]
        slots = self._slots.get(instance)
        while slots is not None and slots.busy:
            freed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._draining.setdefault(instance, []).append(freed)
            await freed
        self._slots.pop(instance, None)

    def _slot_freed(self, instance: Instance) -> None:
        """A slot of a removed instance was freed: its `remove_instance` looks again."""
        for freed in self._draining.pop(instance, ()):
            if not freed.done():
                freed.set_result(None)

    # -- stopping ----------------------------------------------------------------------------------
    def fail_queued(self, error: ServerError) -> int:
        """Fail every request still waiting in the queue; running ones go on. Returns how many."""
        return self._fail_all_queued(error, OTHER)

    def _fail_all_queued(self, error: ServerError, reason: str) -> int:
        failed = 0
        while self._queue:
            pending = self._queue.popleft()
            if not pending.future.done():
                self._record_failure(pending.enqueued_ns, reason)
                if pending.answer:
                    pending.future.set_exception(error)
                else:
                    pending.future.set_result(error)
                failed += 1
        return failed

    async def _before_workers_stop(self) -> None:
        """Requests waiting at a gate are failed as queued ones are (`stop` cancels nothing else:
        what was sent runs on and answers its callers)."""
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
