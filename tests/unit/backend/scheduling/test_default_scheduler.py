"""pystub_backend.backend.scheduling.default: the push scheduler without workers. A request goes from
the caller's task when a slot is free and nothing is queued, else it queues; every slot freed (an
`execute` returned), every instance back to READY and every gate passed pumps the queue, in order,
within PIPELINE_DEPTH executes per instance; stopping fails what is queued; statistics count.

The instance here plays ModelInstance's part of the contract (`submit`, `on_change`, `gate`) and
lets the test decide when each `execute` returns; the exchange under `submit` is tested over a
real channel in test_stub_exchange.py, and every integration test of a default-scheduled model
runs through this path with real stubs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest, InferResponse
from pystub_backend.backend.response_stream import ResponseStream
from pystub_backend.backend.scheduling import default
from pystub_backend.backend.scheduling.default import DEEP_PIPELINE_DEPTH, PIPELINE_DEPTH, DefaultScheduler
from pystub_backend.backend.supervision.exchange import ExecuteEnd, Submission
from pystub_backend.backend.telemetry.statistics import BatchTiming, ModelStatistics
from pystub_backend.ipc.status import Status


class Gate:
    """An admission step the test opens: `enter` waits until `opened` is set."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.entered = 0
        self.left = 0

    async def enter(self) -> None:
        self.entered += 1
        await self.opened.wait()

    def leave(self) -> None:
        self.left += 1


class Instance:
    """Sends each batch at once (or refuses it, `full`: the channel has no room); `finish(i)`
    answers batch i and ends its `execute`."""

    name = "fake_0"
    held = False
    healthy_now = True
    full = False  # a send that may not wait finds no room
    gate: Gate | None = None

    def __init__(self) -> None:
        self.sent: list[tuple[list[str], list[ResponseStream], ExecuteEnd, bool]] = []
        self._listeners: list[Callable[[], None]] = []

    usable_now = True  # READY, or expected back (restarting)
    healthy = property(lambda self: self.healthy_now)
    usable = property(lambda self: self.usable_now)

    def unhealthy_error(self) -> ServerError:
        return ServerError("Stub process 'fake_0' is not healthy.", Status.UNAVAILABLE)

    def on_change(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def changed(self) -> None:
        for callback in self._listeners:
            callback()

    def submit(self, requests: list[InferRequest], *, wait: bool) -> Submission | None:
        if self.full and not wait:
            return None
        end = ExecuteEnd()
        streams = [ResponseStream(request.id, request.model_name, lambda: None) for request in requests]
        self.sent.append(([request.id for request in requests], streams, end, wait))
        return Submission(list(streams), BatchTiming(10, 20, 30), end)

    def finish(self, index: int) -> None:
        ids, streams, end, _ = self.sent[index]
        for rid, stream in zip(ids, streams, strict=True):
            stream.put(InferResponse("m", "1", rid), True)
        end.end()

    def order(self) -> list[str]:
        return [ids[0] for ids, _, _, _ in self.sent]

    def waits(self) -> list[bool]:
        return [wait for _, _, _, wait in self.sent]


def run(body: Callable[[DefaultScheduler, Instance, ModelStatistics], Awaitable[None]]) -> None:
    async def main() -> None:
        instance, stats = Instance(), ModelStatistics("m", "1")
        scheduler = DefaultScheduler([instance], stats)
        scheduler.start()
        try:
            await asyncio.wait_for(body(scheduler, instance, stats), 10)
        finally:
            await scheduler.stop("stopped by the test")

    asyncio.run(main())


def request(rid: str) -> InferRequest:
    return InferRequest("m", id=rid)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_an_idle_instance_gets_the_request_from_the_callers_task() -> None:
    async def body(scheduler: DefaultScheduler, instance: Instance, stats: ModelStatistics) -> None:
        stream = await scheduler.schedule_stream(request("a"), 1)
        assert instance.order() == ["a"] and instance.waits() == [False], "sent at once, from the caller's task"
        instance.finish(0)
        assert (await stream.single()).id == "a"
        await settle()
        assert stats.execution_count == 1 and stats.inference_count == 1 and stats.success.count == 1
        assert stats.queue.count == 1 and 0 < stats.queue.ns <= stats.success.ns

    run(body)


def test_a_unary_request_is_answered_by_its_stream() -> None:
    async def body(scheduler: DefaultScheduler, instance: Instance, stats: ModelStatistics) -> None:
        task = asyncio.ensure_future(scheduler.schedule(request("a"), 1))
        await settle()
        assert instance.order() == ["a"] and not task.done()
        instance.finish(0)
        assert (await task).id == "a"

    run(body)


def test_an_answer_that_comes_as_its_caller_is_cancelled_is_released() -> None:
    """The response is in, but the caller was cancelled before its task ran again: nobody will
    encode the response, so the scheduler gives back what it holds (a stub's arena bytes)."""
    async def body(scheduler: DefaultScheduler, instance: Instance, stats: ModelStatistics) -> None:
        task = asyncio.ensure_future(scheduler.schedule(request("a"), 1))
        await settle()
        released: list[str] = []
        _, streams, end, _ = instance.sent[0]
        streams[0].put(InferResponse("m", "1", "a", release=lambda: released.append("a")), True)
        end.end()
        task.cancel()  # in the same turn: the task has not seen its answer
        try:
            await task
        except asyncio.CancelledError:
            pass
        assert task.cancelled() and released == ["a"]

    run(body)


def test_pipeline_depth_holds_and_order_is_kept() -> None:
    async def body(scheduler: DefaultScheduler, instance: Instance, stats: ModelStatistics) -> None:
        ids = [f"r{i}" for i in range(PIPELINE_DEPTH + 2)]
        tasks = [asyncio.ensure_future(scheduler.schedule(request(rid), 1)) for rid in ids]
        await settle()
        assert instance.order() == ids[:PIPELINE_DEPTH], "no more than PIPELINE_DEPTH executes at once"
        assert scheduler.queued == 2
        instance.finish(0)
        # the freed slot takes the oldest queued request before anything that comes later
        late = asyncio.ensure_future(scheduler.schedule(request("late"), 1))
        await settle()
        assert instance.order() == ids[:PIPELINE_DEPTH + 1]
        assert instance.waits() == [False] * PIPELINE_DEPTH + [True], "queued work is sent from the pump"
        for index in range(1, len(ids) + 1):
            instance.finish(index)
            await settle()
        assert instance.order() == [*ids, "late"]
        assert [response.id for response in await asyncio.gather(*tasks, late)] == [*ids, "late"]
        await settle()
        assert stats.success.count == len(ids) + 1 and stats.execution_count == len(ids) + 1

    run(body)


def test_an_instance_with_quick_executes_gets_deeper_slots_and_loses_them_when_they_slow(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Quick and slow are set by the threshold, not by how fast this machine runs the test: every
    execute is quick under a threshold of an hour, and slow under one of a nanosecond."""
    async def body(scheduler: DefaultScheduler, instance: Instance, stats: ModelStatistics) -> None:
        finished = 0

        async def sent_at_once(count: int) -> int:
            """Schedule `count` requests at once: how many went to the instance before any
            execute returned; then every execute returns, in order."""
            nonlocal finished
            tasks = [asyncio.ensure_future(scheduler.schedule(request(f"r{n}"), 1)) for n in range(count)]
            await settle()
            sent = len(instance.sent) - finished
            while finished < len(instance.sent):
                instance.finish(finished)
                finished += 1
                await settle()
            await asyncio.gather(*tasks)
            return sent

        monkeypatch.setattr(default, "QUICK_EXECUTE_NS", 3600 * 10**9)
        assert await sent_at_once(DEEP_PIPELINE_DEPTH + 1) == PIPELINE_DEPTH, "an instance not yet seen to be quick"
        for _ in range(12):
            await sent_at_once(1)
        assert await sent_at_once(DEEP_PIPELINE_DEPTH + 1) == DEEP_PIPELINE_DEPTH, "an instance seen to be quick"
        monkeypatch.setattr(default, "QUICK_EXECUTE_NS", 1)
        await sent_at_once(1)
        assert await sent_at_once(DEEP_PIPELINE_DEPTH + 1) == PIPELINE_DEPTH, "an instance whose last execute was slow"

    monkeypatch.setattr(default, "QUICK_EXECUTE_NS", 3600 * 10**9)  # the scheduler's first estimate
    run(body)


def test_a_request_finding_the_channel_full_goes_the_waiting_way() -> None:
    async def body(scheduler: DefaultScheduler, instance: Instance, stats: ModelStatistics) -> None:
        instance.full = True  # a send that may not wait finds no room: the pump sends it with wait=True
        task = asyncio.ensure_future(scheduler.schedule(request("a"), 1))
        await settle()
        assert instance.order() == ["a"] and instance.waits() == [True] and scheduler.queued == 0
        instance.finish(0)
        assert (await task).id == "a"
        await settle()
        assert stats.execution_count == 1 and stats.success.count == 1

    run(body)


def test_a_queued_request_fails_when_the_scheduler_stops() -> None:
    async def main() -> None:
        instance, stats = Instance(), ModelStatistics("m", "1")
        scheduler = DefaultScheduler([instance], stats)
        scheduler.start()
        running = [asyncio.ensure_future(scheduler.schedule_stream(request(f"r{i}"), 1)) for i in range(PIPELINE_DEPTH)]
        waiting = asyncio.ensure_future(scheduler.schedule(request("waits"), 1))
        await settle()
        assert scheduler.queued == 1
        await scheduler.stop("stopped by the test")
        try:
            await asyncio.wait_for(waiting, 5)
        except ServerError as error:
            assert error.status == Status.UNAVAILABLE and error.message == "stopped by the test"
        else:
            raise AssertionError("the waiting request was not failed")
        assert stats.failures["OTHER"] == 1
        for task in running:
            task.result().cancel()

    asyncio.run(main())


def test_a_held_instance_is_not_sent_to_and_its_release_pumps() -> None:
    async def body(scheduler: DefaultScheduler, instance: Instance, stats: ModelStatistics) -> None:
        instance.held = True  # an execute waits for a BLS call: the request waits in the queue
        first = asyncio.ensure_future(scheduler.schedule(request("a"), 1))
        second = asyncio.ensure_future(scheduler.schedule(request("b"), 1))
        await settle()
        assert instance.sent == [] and scheduler.queued == 2
        second.cancel()
        await settle()
        assert stats.failures["CANCELED"] == 1
        instance.held = False
        instance.changed()  # the hold ended
        await settle()
        assert instance.order() == ["a"], "the cancelled request is skipped"
        instance.finish(0)
        assert (await first).id == "a"

    run(body)


def test_an_instance_that_fails_for_good_fails_the_queue() -> None:
    async def body(scheduler: DefaultScheduler, instance: Instance, stats: ModelStatistics) -> None:
        instance.healthy_now = False  # restarting: expected back, so the request waits
        task = asyncio.ensure_future(scheduler.schedule(request("a"), 1))
        await settle()
        assert scheduler.queued == 1
        instance.usable_now = False
        instance.changed()  # FAILED: it will never come back
        try:
            await asyncio.wait_for(task, 5)
        except ServerError as error:
            assert error.message == "Stub process 'fake_0' is not healthy."
        else:
            raise AssertionError("the queued request was not failed")
        assert stats.failures["BACKEND"] == 1

    run(body)


def test_a_gated_instance_is_sent_to_after_its_gate_and_leaves_it_when_execute_returns() -> None:
    async def main() -> None:
        instance, stats = Instance(), ModelStatistics("m", "1")
        gate = instance.gate = Gate()
        scheduler = DefaultScheduler([instance], stats)
        scheduler.start()
        try:
            task = asyncio.ensure_future(scheduler.schedule(request("a"), 1))
            await settle()
            assert gate.entered == 1 and instance.sent == [], "it waits at the gate"
            gate.opened.set()
            await settle()
            assert instance.order() == ["a"] and gate.left == 0
            instance.finish(0)
            assert (await asyncio.wait_for(task, 5)).id == "a"
            assert gate.left == 1
        finally:
            await scheduler.stop("stopped by the test")

    asyncio.run(main())
