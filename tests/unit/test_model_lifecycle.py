"""Retiring a model version (backend.model_lifecycle): queued requests fail at once, requests in
flight finish or, past the timeout, fail with a clear error; the index rows an entry shows."""

from __future__ import annotations

import asyncio
from typing import Any

from backend.errors import ServerError
from backend.model_lifecycle import InFlight, ModelEntry, retire
from backend.scheduler import DefaultScheduler
from backend.statistics import ModelStatistics


class FakeInstance:
    """Executes each request by sleeping its `delay` seconds."""

    healthy = usable = alive = True

    def __init__(self) -> None:
        self.started: list[Any] = []

    async def wait_ready(self) -> bool:
        return True

    async def execute_timed(self, requests: list[Any]) -> tuple[list[Any], Any]:
        from backend.statistics import BatchTiming

        self.started.extend(requests)
        await asyncio.sleep(requests[0].delay)
        return [f"done {requests[0].delay}"], BatchTiming()

    def unhealthy_error(self) -> ServerError:
        return ServerError("unhealthy")


class Request:
    def __init__(self, delay: float) -> None:
        self.delay = delay


class FakeVersion:
    name, version = "m", 1

    def __init__(self) -> None:
        self.instance = FakeInstance()
        self.scheduler = DefaultScheduler([self.instance], ModelStatistics("m", "1"))
        self.unloaded_with: float | None = None

    async def unload(self, timeout: float) -> None:
        self.unloaded_with = timeout
        assert self.scheduler is not None
        await self.scheduler.stop("stopped")


async def _serve(in_flight: InFlight, version: FakeVersion, delay: float) -> Any:
    """What Core.infer does around the scheduler."""
    task = in_flight.enter(version)  # type: ignore[arg-type]
    try:
        return await version.scheduler.schedule(Request(delay), 1)  # type: ignore[arg-type]
    except asyncio.CancelledError:
        error = in_flight.abandoned_error(task)
        if error is None:
            raise
        return error
    except ServerError as exc:
        return exc
    finally:
        in_flight.leave(version, task)  # type: ignore[arg-type]


def _run_retire(delays: list[float], timeout: float) -> tuple[list[Any], FakeVersion]:
    async def scenario() -> tuple[list[Any], FakeVersion]:
        version = FakeVersion()
        version.scheduler.start()
        in_flight = InFlight()
        tasks = [asyncio.ensure_future(_serve(in_flight, version, delay)) for delay in delays]
        await asyncio.sleep(0.02)  # the scheduler's workers take the first ones
        await retire(version, in_flight, timeout)  # type: ignore[arg-type]
        results = await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert in_flight.count(version) == 0  # type: ignore[arg-type]
        return results, version

    return asyncio.run(scenario())


def _texts(results: list[Any]) -> list[str]:
    return [r.message if isinstance(r, ServerError) else r for r in results]


def test_in_flight_requests_finish_and_queued_ones_fail():
    results, version = _run_retire([0.05, 0.05, 0.05, 0.05], timeout=2.0)
    texts = _texts(results)
    running = len(version.instance.started)
    assert texts[:running] == ["done 0.05"] * running
    assert texts[running:] == ["Model 'm' version 1 is unloading; the queued request was not executed."] * (4 - running)
    assert 1 <= running < 4
    assert version.unloaded_with is not None and version.unloaded_with > 1.0


def test_requests_past_the_timeout_fail_clearly():
    results, version = _run_retire([10.0, 10.0, 10.0], timeout=0.1)
    texts = _texts(results)
    running = len(version.instance.started)
    abandoned = "Model 'm' version 1 was unloaded before the request completed (waited 0.1 s)."
    assert texts[:running] == [abandoned] * running
    assert all("queued request was not executed" in text for text in texts[running:])
    assert version.unloaded_with == 1.0  # the finalize still gets at least a second


def test_index_rows():
    entry = ModelEntry("m")
    assert entry.index_rows() == [{"name": "m", "version": "", "state": "UNAVAILABLE", "reason": ""}]
    entry.failed = {2: "boom"}
    entry.unloaded = [1, 2]
    assert entry.index_rows() == [
        {"name": "m", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
        {"name": "m", "version": "2", "state": "UNAVAILABLE", "reason": "boom"},
    ]
    entry.failed, entry.unloaded = {}, [1]
    entry.state, entry.reason = "UNAVAILABLE", "unloaded"
    assert entry.is_unloaded
