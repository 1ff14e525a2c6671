"""pystub_backend.backend.telemetry.statistics and where the schedulers count: executions, successes, and each failure
with its reason (REJECTED, CANCELED, BACKEND, OTHER)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import scheduling_fakes as fakes
from tritonclient.grpc import model_config_pb2

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest, InferResponse, Tensor
from pystub_backend.backend.response_stream import ResponseStream
from pystub_backend.backend.scheduling.default import DefaultScheduler
from pystub_backend.backend.scheduling.dynamic import DynamicBatcher
from pystub_backend.backend.scheduling.sequence import SequenceBatcher
from pystub_backend.backend.telemetry.statistics import FAILURE_REASONS, BatchTiming, ModelStatistics
from pystub_backend.ipc.status import Status


class FakeInstance(fakes.FakeInstance):
    """Answers each request by its id: "ok…" succeeds, "model…" fails in the model, "cancel…"
    is answered CANCELLED, "left…" is cancelled by its client and then ended by the model without an
    error; `hold` keeps a batch running; `dead` fails it before the model."""

    def error_for(self, request: InferRequest) -> ServerError | None:
        return {"model": ServerError("model error", Status.INTERNAL),
                "cancel": ServerError("cancelled", Status.CANCELLED)}.get(request.id.rstrip("0123456789"))

    def answer(self, request: InferRequest, stream: ResponseStream) -> None:
        if request.id.startswith("left"):  # the client cancelled; the model ended it without an error
            stream.cancel(keep_responses=True)
            stream.put(InferResponse("m", "", request.id), True)
        else:
            super().answer(request, stream)


def request(rid: str, rows: int = 1) -> InferRequest:
    return InferRequest("m", id=rid, inputs=[Tensor("INPUT0", "FP32", (rows, 1), bytes(4 * rows))])


def failures(stats: ModelStatistics) -> dict[str, int]:
    return {reason: count for reason, count in stats.failures.items() if count}


def run(body: Callable[[Any, FakeInstance, ModelStatistics], Awaitable[None]], batching: bool,
        max_queue_size: int = 0) -> None:
    async def main() -> None:
        instance, stats = FakeInstance(), ModelStatistics("m", "1")
        if batching:
            config = model_config_pb2.ModelConfig(name="m", max_batch_size=8)
            config.dynamic_batching.max_queue_delay_microseconds = 100_000
            config.dynamic_batching.default_queue_policy.max_queue_size = max_queue_size
            config.dynamic_batching.default_queue_policy.allow_timeout_override = True
            scheduler: Any = DynamicBatcher([instance], stats, config)
        else:
            scheduler = DefaultScheduler([instance], stats)
        scheduler.start()
        try:
            await asyncio.wait_for(body(scheduler, instance, stats), 10)
        finally:
            await scheduler.stop("stopped by the test")

    asyncio.run(main())


async def outcome(call: Awaitable[Any]) -> str:
    try:
        await call
    except ServerError as error:
        return error.status.name
    return "OK"


def test_failure_reasons_are_validated_and_counted() -> None:
    stats = ModelStatistics("m", "1")
    stats.record_failure(5)  # BACKEND by default, as callers that pass no reason expect
    stats.record_failure(7, "CANCELED")
    with pytest.raises(ValueError, match="unknown failure reason 'NOPE'"):
        stats.record_failure(1, "NOPE")
    assert failures(stats) == {"BACKEND": 1, "CANCELED": 1} and stats.fail.count == 2 and stats.fail.ns == 12
    assert tuple(stats.failures) == FAILURE_REASONS and stats.last_inference_ms > 0


def test_executions_and_inferences_are_counted_apart() -> None:
    stats = ModelStatistics("m", "1")
    stats.record_execution(8, BatchTiming(1, 2, 3))  # requests of 2, 3 and 3 rows
    stats.record_success(2, 100, 10, BatchTiming(1, 2, 3))
    stats.record_failure(50, "BACKEND", inferences=3)  # an error response: the model answered it
    stats.record_failure(50, "BACKEND")  # execute raised: no inference
    data = stats.as_dict()
    assert (data["execution_count"], data["inference_count"]) == (1, 5)
    assert data["batch_stats"][0]["batch_size"] == 8 and data["inference_stats"]["success"]["count"] == 1
    assert stats.load_duration_s is None
    stats.loaded()
    assert stats.load_duration_s is not None and stats.load_duration_s >= 0


@pytest.mark.parametrize("batching", [False, True], ids=["default", "dynamic_batcher"])
def test_a_request_its_client_cancelled_counts_as_canceled_not_success(batching: bool) -> None:
    async def body(scheduler: Any, instance: FakeInstance, stats: ModelStatistics) -> None:
        await asyncio.gather(*(outcome(scheduler.schedule(request(rid), 1)) for rid in ("ok1", "left1")))
        assert failures(stats) == {"CANCELED": 1} and stats.success.count == 1 and stats.inference_count == 2

    run(body, batching)


@pytest.mark.parametrize("batching", [False, True], ids=["default", "dynamic_batcher"])
def test_model_errors_and_cancelled_answers(batching: bool) -> None:
    async def body(scheduler: Any, instance: FakeInstance, stats: ModelStatistics) -> None:
        answers = await asyncio.gather(*(outcome(scheduler.schedule(request(rid), 1))
                                         for rid in ("ok1", "model1", "cancel1")))
        assert answers == ["OK", "INTERNAL", "CANCELLED"]
        assert failures(stats) == {"BACKEND": 1, "CANCELED": 1}
        assert stats.success.count == 1 and stats.inference_count == 3

    run(body, batching)


@pytest.mark.parametrize("batching", [False, True], ids=["default", "dynamic_batcher"])
def test_a_batch_failure_is_an_execution_but_no_inference(batching: bool) -> None:
    """As in Triton: a request whose stream the stub failed (execute raised, stub died) is not an
    inference; an error response the model returned is."""
    async def body(scheduler: Any, instance: FakeInstance, stats: ModelStatistics) -> None:
        instance.fail_batch = True
        assert await outcome(scheduler.schedule(request("ok1", rows=2), 2)) == "INTERNAL"
        instance.fail_batch = False
        assert await outcome(scheduler.schedule(request("model1", rows=3), 3)) == "INTERNAL"
        assert (stats.execution_count, stats.inference_count) == (2, 3)
        assert failures(stats) == {"BACKEND": 2}

    run(body, batching)


@pytest.mark.parametrize("batching", [False, True], ids=["default", "dynamic_batcher"])
def test_a_request_cancelled_while_queued_is_canceled_and_never_executes(batching: bool) -> None:
    async def body(scheduler: Any, instance: FakeInstance, stats: ModelStatistics) -> None:
        instance.hold = asyncio.Event()
        busy = [asyncio.ensure_future(scheduler.schedule(request(f"ok{n}"), 1)) for n in range(2)]
        await instance.started.wait()
        await asyncio.sleep(0.01)  # the default scheduler's pipeline takes the second request too
        queued = asyncio.ensure_future(scheduler.schedule(request("ok9"), 1))
        await asyncio.sleep(0.01)
        queued.cancel()
        await asyncio.gather(queued, return_exceptions=True)
        assert failures(stats) == {"CANCELED": 1}
        instance.hold.set()
        await asyncio.gather(*busy)
        assert stats.success.count == 2 and failures(stats) == {"CANCELED": 1}

    run(body, batching)


@pytest.mark.parametrize("batching", [False, True], ids=["default", "dynamic_batcher"])
def test_requests_that_never_reach_the_model_are_no_execution(batching: bool) -> None:
    async def body(scheduler: Any, instance: FakeInstance, stats: ModelStatistics) -> None:
        instance.dead = True
        assert await outcome(scheduler.schedule(request("ok1"), 1)) == "UNAVAILABLE"
        assert failures(stats) == {"BACKEND": 1} and stats.execution_count == 0 and stats.inference_count == 0

    run(body, batching)


@pytest.mark.parametrize("batching", [False, True], ids=["default", "dynamic_batcher"])
def test_queued_requests_failed_by_unloading_are_other(batching: bool) -> None:
    async def body(scheduler: Any, instance: FakeInstance, stats: ModelStatistics) -> None:
        instance.hold = asyncio.Event()
        running = [asyncio.ensure_future(scheduler.schedule(request(f"ok{n}", rows=8), 8)) for n in range(3)]
        await instance.started.wait()
        await asyncio.sleep(0.01)
        queued = 2 if batching else 1  # the default scheduler runs two requests per instance at once
        assert scheduler.fail_queued(ServerError("unloading", Status.UNAVAILABLE)) == queued
        instance.hold.set()
        answers = await asyncio.gather(*(outcome(r) for r in running))
        assert sorted(answers) == ["OK"] * (3 - queued) + ["UNAVAILABLE"] * queued
        assert failures(stats) == {"OTHER": queued}

    run(body, batching)


def test_a_full_queue_and_a_queue_timeout_are_rejected() -> None:
    async def body(scheduler: Any, instance: FakeInstance, stats: ModelStatistics) -> None:
        instance.hold = asyncio.Event()
        busy = asyncio.ensure_future(scheduler.schedule(request("ok0", rows=8), 8))
        await instance.started.wait()
        queued = [asyncio.ensure_future(scheduler.schedule(request("ok1", rows=8), 8))]
        timed = InferRequest("m", id="ok2", inputs=[Tensor("INPUT0", "FP32", (1, 1), bytes(4))],
                             parameters={"timeout": 1000})
        assert await outcome(scheduler.schedule(timed, 1)) == "UNAVAILABLE"  # 1 ms in the queue, then REJECT
        queued.append(asyncio.ensure_future(scheduler.schedule(request("ok3", rows=8), 8)))
        await asyncio.sleep(0.01)
        assert await outcome(scheduler.schedule(request("ok4"), 1)) == "UNAVAILABLE"  # max_queue_size 2
        assert failures(stats) == {"REJECTED": 2}
        instance.hold.set()
        await asyncio.gather(busy, *queued)
        assert failures(stats) == {"REJECTED": 2} and stats.success.count == 3

    run(body, True, max_queue_size=2)


def test_the_sequence_batcher_records_failures_as_the_others_do() -> None:
    """Each failure with its reason: the model's CANCELLED answer is CANCELED, its error BACKEND,
    requests still queued when the model unloads OTHER (it used to record every one as BACKEND)."""
    async def main() -> None:
        instance, stats = FakeInstance(), ModelStatistics("m", "1")
        config = model_config_pb2.ModelConfig(name="m", max_batch_size=1)
        config.sequence_batching.max_sequence_idle_microseconds = 10_000_000
        batcher = SequenceBatcher([instance], stats, config)
        batcher.start()

        def step(rid: str, sequence: int, start: bool = False, end: bool = False) -> Awaitable[str]:
            sent = request(rid)
            sent.parameters = {"sequence_id": sequence, "sequence_start": start, "sequence_end": end}
            return outcome(batcher.schedule(sent, 1))

        try:
            answers = await asyncio.wait_for(asyncio.gather(
                step("ok1", 1, start=True), step("model1", 1), step("cancel1", 1, end=True)), 10)
            assert answers == ["OK", "INTERNAL", "CANCELLED"]
            assert failures(stats) == {"BACKEND": 1, "CANCELED": 1}
            instance.hold = asyncio.Event()
            running = asyncio.ensure_future(step("ok2", 2, start=True))
            await asyncio.sleep(0.01)
            queued = asyncio.ensure_future(step("ok3", 2, end=True))
            await asyncio.sleep(0.01)
            assert batcher.fail_queued(ServerError("unloading", Status.UNAVAILABLE)) == 1
            instance.hold.set()
            assert await asyncio.wait_for(asyncio.gather(running, queued), 10) == ["OK", "UNAVAILABLE"]
            assert failures(stats) == {"BACKEND": 1, "CANCELED": 1, "OTHER": 1}
            assert (stats.execution_count, stats.inference_count, stats.success.count) == (4, 4, 2)
        finally:
            await batcher.stop("stopped by the test")

    asyncio.run(main())
