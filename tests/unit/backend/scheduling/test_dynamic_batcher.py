"""DynamicBatcher (pystub_backend/backend/scheduling/dynamic.py) against fake instances: batching of bursts, the
queue delay, priorities, timeouts, max_queue_size, preserve_ordering, per-request errors,
statistics, a dead instance's batch going to another, cancellation, fail_queued and stop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import scheduling_fakes as fakes
from tritonclient.grpc import model_config_pb2

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest, Tensor
from pystub_backend.backend.response_stream import ResponseStream
from pystub_backend.backend.scheduling.dynamic import DynamicBatcher
from pystub_backend.backend.telemetry.statistics import ModelStatistics
from pystub_backend.ipc.status import Status


class FakeInstance(fakes.FakeInstance):
    """Executes batches on the loop: `hold` keeps a batch running until set; ids starting with
    "bad" get an error response of their own."""

    def error_for(self, request: InferRequest) -> ServerError | None:
        return ServerError("bad request", Status.INVALID_ARG) if request.id.startswith("bad") else None


def make_config(max_batch_size: int = 8, **batching: Any) -> model_config_pb2.ModelConfig:
    config = model_config_pb2.ModelConfig(name="m", max_batch_size=max_batch_size)
    config.input.add(name="INPUT0", data_type=model_config_pb2.TYPE_FP32, dims=[-1])
    policies = batching.pop("priority_queue_policy", {})
    default_policy = batching.pop("default_queue_policy", None)
    config.dynamic_batching.SetInParent()
    for key, value in batching.items():
        field = getattr(config.dynamic_batching, key)
        if isinstance(value, list):
            field.extend(value)
        else:
            setattr(config.dynamic_batching, key, value)
    if default_policy:
        config.dynamic_batching.default_queue_policy.CopyFrom(model_config_pb2.ModelQueuePolicy(**default_policy))
    for level, policy in policies.items():
        config.dynamic_batching.priority_queue_policy[level].CopyFrom(model_config_pb2.ModelQueuePolicy(**policy))
    return config


def request(rid: str, rows: int = 1, width: int = 1, **parameters: Any) -> InferRequest:
    return InferRequest("m", id=rid, inputs=[Tensor("INPUT0", "FP32", (rows, width), bytes(4 * rows * width))],
                        parameters=parameters)


def run(test: Callable[..., Awaitable[None]], config: model_config_pb2.ModelConfig, instances: int = 1) -> None:
    async def main() -> None:
        fakes = [FakeInstance(f"fake_{n}") for n in range(instances)]
        stats = ModelStatistics("m", "1")
        batcher = DynamicBatcher(fakes, stats, config)
        batcher.start()
        try:
            await asyncio.wait_for(test(batcher, fakes, stats), 10)
        finally:
            await batcher.stop("stopped by the test")

    asyncio.run(main())


async def settle(rounds: int = 5) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


def test_a_burst_becomes_one_batch_and_statistics_count_it_once() -> None:
    async def body(batcher: DynamicBatcher, fakes: list[FakeInstance], stats: ModelStatistics) -> None:
        results = await asyncio.gather(*(batcher.schedule(request(f"r{n}", rows=2), 2) for n in range(3)))
        assert [r.id for r in results] == ["r0", "r1", "r2"]
        assert fakes[0].batches == [["r0", "r1", "r2"]]
        data = stats.as_dict()
        assert data["execution_count"] == 1 and data["inference_count"] == 6
        assert [b["batch_size"] for b in data["batch_stats"]] == [6]
        assert data["inference_stats"]["success"]["count"] == 3 and data["inference_stats"]["queue"]["count"] == 3

    run(body, make_config())


def test_the_queue_delay_gathers_requests_that_arrive_later() -> None:
    async def body(batcher: DynamicBatcher, fakes: list[FakeInstance], stats: ModelStatistics) -> None:
        started = time.monotonic()
        first = asyncio.ensure_future(batcher.schedule(request("early"), 1))
        await asyncio.sleep(0.05)
        assert fakes[0].batches == []  # still waiting for company
        await asyncio.gather(first, batcher.schedule(request("late"), 1))
        assert fakes[0].batches == [["early", "late"]]
        assert 0.2 <= time.monotonic() - started < 1.0

    run(body, make_config(max_queue_delay_microseconds=200_000))


def test_shapes_that_cannot_be_concatenated_go_to_separate_batches() -> None:
    async def body(batcher: DynamicBatcher, fakes: list[FakeInstance], stats: ModelStatistics) -> None:
        await asyncio.gather(batcher.schedule(request("a1", width=2), 1), batcher.schedule(request("b1", width=3), 1),
                             batcher.schedule(request("a2", width=2), 1))
        assert fakes[0].batches == [["a1"], ["b1"], ["a2"]]

    run(body, make_config())


def test_priorities_pick_the_next_batch() -> None:
    async def body(batcher: DynamicBatcher, fakes: list[FakeInstance], stats: ModelStatistics) -> None:
        fakes[0].hold = asyncio.Event()
        busy = asyncio.ensure_future(batcher.schedule(request("busy"), 1))
        await fakes[0].started.wait()
        low = asyncio.ensure_future(batcher.schedule(request("low", priority=2), 1))
        await settle()
        high = asyncio.ensure_future(batcher.schedule(request("high", priority=1), 1))
        await settle()
        fakes[0].hold.set()
        await asyncio.gather(busy, low, high)
        assert fakes[0].batches == [["busy"], ["high"], ["low"]]

    run(body, make_config(max_batch_size=1, priority_levels=2, default_priority_level=2))


def test_a_queue_timeout_rejects_while_the_instance_is_busy() -> None:
    async def body(batcher: DynamicBatcher, fakes: list[FakeInstance], stats: ModelStatistics) -> None:
        fakes[0].hold = asyncio.Event()
        busy = asyncio.ensure_future(batcher.schedule(request("busy"), 1))
        await fakes[0].started.wait()
        started = time.monotonic()
        with pytest.raises(ServerError) as caught:
            await batcher.schedule(request("late", timeout=50_000), 1)
        assert caught.value.status is Status.UNAVAILABLE and caught.value.message == "Request timeout expired"
        assert 0.04 < time.monotonic() - started < 1.0
        fakes[0].hold.set()
        await busy
        assert stats.as_dict()["inference_stats"]["fail"]["count"] == 1

    run(body, make_config(max_batch_size=1, default_queue_policy={"allow_timeout_override": True}))


def test_a_full_queue_refuses_at_once() -> None:
    async def body(batcher: DynamicBatcher, fakes: list[FakeInstance], stats: ModelStatistics) -> None:
        fakes[0].hold = asyncio.Event()
        busy = asyncio.ensure_future(batcher.schedule(request("busy"), 1))
        await fakes[0].started.wait()
        queued = asyncio.ensure_future(batcher.schedule(request("queued"), 1))
        await settle()
        with pytest.raises(ServerError, match="^Exceeds maximum queue size$") as caught:
            await batcher.schedule(request("refused"), 1)
        assert caught.value.status is Status.UNAVAILABLE and batcher.queued == 1
        fakes[0].hold.set()
        await asyncio.gather(busy, queued)

    run(body, make_config(max_batch_size=1, default_queue_policy={"max_queue_size": 1}))


def test_preserve_ordering_holds_later_answers_for_earlier_ones() -> None:
    async def body(batcher: DynamicBatcher, fakes: list[FakeInstance], stats: ModelStatistics) -> None:
        slow, fast = fakes
        slow.hold = asyncio.Event()
        order: list[str] = []

        async def call(rid: str) -> None:
            await batcher.schedule(request(rid), 1)
            order.append(rid)

        first = asyncio.ensure_future(call("first"))
        await slow.started.wait()
        second = asyncio.ensure_future(call("second"))
        await fast.started.wait()
        await settle(20)
        assert order == []  # "second" is done but waits for "first"
        slow.hold.set()
        await asyncio.gather(first, second)
        assert order == ["first", "second"]

    run(body, make_config(max_batch_size=1, preserve_ordering=True), instances=2)


def test_an_error_response_fails_only_its_request() -> None:
    async def body(batcher: DynamicBatcher, fakes: list[FakeInstance], stats: ModelStatistics) -> None:
        results = await asyncio.gather(batcher.schedule(request("ok1"), 1), batcher.schedule(request("bad"), 1),
                                       batcher.schedule(request("ok2"), 1), return_exceptions=True)
        assert fakes[0].batches == [["ok1", "bad", "ok2"]]
        assert [type(r).__name__ for r in results] == ["InferResponse", "ServerError", "InferResponse"]
        assert stats.as_dict()["inference_stats"]["fail"]["count"] == 1

    run(body, make_config())


def test_a_batch_taken_for_a_dead_instance_goes_to_another() -> None:
    async def body(batcher: DynamicBatcher, fakes: list[FakeInstance], stats: ModelStatistics) -> None:
        await settle()  # both workers wait for work, instance 0's first in line
        fakes[0].alive = False
        await batcher.schedule(request("r"), 1)
        assert fakes[0].batches == [] and fakes[1].batches == [["r"]]

    run(body, make_config(), instances=2)


def test_a_cancelled_caller_leaves_the_queue() -> None:
    async def body(batcher: DynamicBatcher, fakes: list[FakeInstance], stats: ModelStatistics) -> None:
        waiting = asyncio.ensure_future(batcher.schedule(request("gone"), 1))
        await settle()
        assert batcher.queued == 1
        waiting.cancel()
        await settle()
        assert batcher.queued == 0

    run(body, make_config(max_queue_delay_microseconds=10_000_000))


def test_stop_fails_the_queue_and_lets_the_running_batch_finish() -> None:
    async def main() -> None:
        fake = FakeInstance()
        fake.hold = asyncio.Event()
        batcher = DynamicBatcher([fake], ModelStatistics("m", "1"), make_config(max_batch_size=1))
        batcher.start()
        running = asyncio.ensure_future(batcher.schedule(request("running"), 1))
        await fake.started.wait()
        queued = [asyncio.ensure_future(batcher.schedule(request(f"q{n}"), 1)) for n in range(3)]
        await settle()
        await asyncio.wait_for(batcher.stop("Model 'm' version 1 is unloading."), 5)
        for task in queued:
            with pytest.raises(ServerError, match="is unloading") as caught:
                await task
            assert caught.value.status is Status.UNAVAILABLE
        with pytest.raises(ServerError, match="is unloading"):
            await batcher.schedule(request("after"), 1)
        fake.hold.set()
        assert (await asyncio.wait_for(running, 5)).id == "running"

    asyncio.run(main())


def test_fail_queued_answers_the_queue_and_keeps_serving() -> None:
    async def body(batcher: DynamicBatcher, fakes: list[FakeInstance], stats: ModelStatistics) -> None:
        waiting = [asyncio.ensure_future(batcher.schedule(request(f"w{n}"), 1)) for n in range(2)]
        await settle()
        assert batcher.fail_queued(ServerError("unloading", Status.UNAVAILABLE)) == 2
        for task in waiting:
            with pytest.raises(ServerError, match="unloading"):
                await task

    run(body, make_config(max_queue_delay_microseconds=10_000_000))


def test_schedule_stream_hands_over_the_stream() -> None:
    async def body(batcher: DynamicBatcher, fakes: list[FakeInstance], stats: ModelStatistics) -> None:
        stream = await batcher.schedule_stream(request("s"), 1)
        assert isinstance(stream, ResponseStream)
        assert (await stream.single()).id == "s"

    run(body, make_config(preserve_ordering=True))
