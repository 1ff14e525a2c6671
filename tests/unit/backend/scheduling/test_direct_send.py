"""pystub_backend.backend.scheduling.default: the direct send from the caller's task, and the
pipeline slots it shares with the workers (order, the PIPELINE_DEPTH limit, stopping, statistics).

The instance here plays ModelInstance's part of the contract (`start_streams`, `counted`,
`execute_streams`) and lets the test decide when each `execute` returns; the exchange under
`start_streams` is tested over a real channel in test_stub_exchange.py, and every integration
test of a default-scheduled model runs through this path with real stubs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest, InferResponse
from pystub_backend.backend.response_stream import ResponseStream
from pystub_backend.backend.scheduling.default import PIPELINE_DEPTH, DefaultScheduler
from pystub_backend.backend.telemetry.statistics import BatchTiming, ModelStatistics
from pystub_backend.ipc.status import Status


class Instance:
    """Sends each batch at once; `finish(i)` answers batch i and ends its `execute`."""

    name = "fake_0"
    held = False

    def __init__(self) -> None:
        self.sent: list[tuple[list[str], list[ResponseStream], asyncio.Future[None]]] = []
        self.through_worker = 0  # batches that came the queued way (execute_streams)
        self.counted_streams = 0

    healthy = usable = property(lambda self: True)

    def unhealthy_error(self) -> ServerError:
        return ServerError("Stub process 'fake_0' is not healthy.", Status.UNAVAILABLE)

    async def wait_ready(self) -> bool:
        while self.held:  # as ModelInstance: a worker waits while an execute is held by BLS
            await asyncio.sleep(0.01)
        return True

    def start_streams(self, requests: list[InferRequest]) -> tuple[list[Any], BatchTiming, asyncio.Future[None]]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        streams = [ResponseStream(request.id, request.model_name, lambda: None) for request in requests]
        self.sent.append(([request.id for request in requests], streams, done))
        return list(streams), BatchTiming(10, 20, 30), done

    def counted(self, streams: list[Any]) -> None:
        self.counted_streams += len(streams)

    async def execute_streams(self, requests: list[InferRequest], on_sent: Any = None) -> tuple[list[Any], BatchTiming]:
        self.through_worker += 1
        results, timing, done = self.start_streams(requests)
        if on_sent is not None:
            on_sent(results)
        await done
        self.counted(results)
        return results, timing

    def finish(self, index: int) -> None:
        ids, streams, done = self.sent[index]
        for rid, stream in zip(ids, streams, strict=True):
            stream.put(InferResponse("m", "1", rid), True)
        done.set_result(None)

    def order(self) -> list[str]:
        return [ids[0] for ids, _, _ in self.sent]


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
        assert instance.order() == ["a"] and instance.through_worker == 0, "sent without a worker"
        instance.finish(0)
        assert (await stream.single()).id == "a"
        await settle()
        assert stats.execution_count == 1 and stats.inference_count == 1 and stats.success.count == 1
        assert stats.queue.count == 1 and 0 < stats.queue.ns <= stats.success.ns
        assert instance.counted_streams == 1

    run(body)


def test_pipeline_depth_holds_across_both_paths_and_order_is_kept() -> None:
    async def body(scheduler: DefaultScheduler, instance: Instance, stats: ModelStatistics) -> None:
        ids = [f"r{i}" for i in range(PIPELINE_DEPTH + 2)]
        tasks = [asyncio.ensure_future(scheduler.schedule(request(rid), 1)) for rid in ids]
        await settle()
        assert instance.order() == ids[:PIPELINE_DEPTH], "no more than PIPELINE_DEPTH executes at once"
        assert instance.through_worker == 0
        assert scheduler.queued == 2, "held by workers that wait for a slot, still queued"
        instance.finish(0)
        # a request that comes now must not overtake the ones a worker already waits with
        late = asyncio.ensure_future(scheduler.schedule(request("late"), 1))
        await settle()
        assert instance.order() == ids[:PIPELINE_DEPTH + 1]
        for index in range(1, len(ids) + 1):
            instance.finish(index)
            await settle()
        assert instance.order() == [*ids, "late"]
        assert [response.id for response in await asyncio.gather(*tasks, late)] == [*ids, "late"]
        await settle()
        assert stats.success.count == len(ids) + 1 and stats.execution_count == len(ids) + 1

    run(body)


def test_a_worker_waiting_for_a_slot_fails_its_request_when_the_scheduler_stops() -> None:
    async def main() -> None:
        instance, stats = Instance(), ModelStatistics("m", "1")
        scheduler = DefaultScheduler([instance], stats)
        scheduler.start()
        running = [asyncio.ensure_future(scheduler.schedule_stream(request(f"r{i}"), 1)) for i in range(PIPELINE_DEPTH)]
        waiting = asyncio.ensure_future(scheduler.schedule(request("waits"), 1))
        await settle()
        assert scheduler.queued == 1, "a worker took it and waits for a slot: still queued"
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


def test_a_held_instance_is_not_sent_to_directly() -> None:
    async def body(scheduler: DefaultScheduler, instance: Instance, stats: ModelStatistics) -> None:
        instance.held = True  # an execute waits for a BLS call: the request waits in the queue
        task = asyncio.ensure_future(scheduler.schedule(request("a"), 1))
        await settle()
        assert instance.sent == [] and scheduler.queued == 1
        task.cancel()
        await settle()
        assert stats.failures["CANCELED"] == 1

    run(body)
