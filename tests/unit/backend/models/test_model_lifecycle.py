"""Retiring a model version (pystub_backend.backend.models.lifecycle): queued requests fail at once, requests in
flight finish or, past the timeout, fail with a clear error; the index rows an entry shows."""

from __future__ import annotations

import asyncio
from typing import Any

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.models.lifecycle import InFlight, ModelEntry, retire


class FakeScheduler:
    """Runs `slots` requests at once (each sleeps its delay); the rest wait in a queue."""

    def __init__(self, slots: int = 2) -> None:
        self.slots = slots
        self.running = 0
        self.started = 0
        self.waiting: list[asyncio.Future[Any]] = []

    async def schedule(self, request: Request, batch_size: int) -> str:
        if self.running >= self.slots:
            turn = asyncio.get_running_loop().create_future()
            self.waiting.append(turn)
            result = await turn
            if isinstance(result, ServerError):
                raise result
        self.running += 1
        self.started += 1
        try:
            await asyncio.sleep(request.delay)
            return f"done {request.delay}"
        finally:
            self.running -= 1
            while self.waiting:
                turn = self.waiting.pop(0)
                if not turn.done():
                    turn.set_result(None)
                    break

    def fail_queued(self, error: ServerError) -> int:
        waiting, self.waiting = self.waiting, []
        for turn in waiting:
            turn.set_result(error)
        return len(waiting)


class Request:
    def __init__(self, delay: float) -> None:
        self.delay = delay


class FakeVersion:
    name, version = "m", 1

    def __init__(self) -> None:
        self.scheduler = FakeScheduler()
        self.unloaded_with: float | None = None
        self.in_flight: set[Any] = set()  # what lifecycle.InFlight tracks (as ModelVersion has)

    async def unload(self, timeout: float) -> None:
        self.unloaded_with = timeout


async def _serve(in_flight: InFlight, version: FakeVersion, delay: float) -> Any:
    """What Core.infer does around the scheduler."""
    task = in_flight.enter(version)  # type: ignore[arg-type]
    try:
        return await version.scheduler.schedule(Request(delay), 1)
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
    running = version.scheduler.started
    assert texts[:running] == ["done 0.05"] * running
    assert texts[running:] == ["Model 'm' version 1 is unloading; the queued request was not executed."] * (4 - running)
    assert 1 <= running < 4
    assert version.unloaded_with is not None and version.unloaded_with > 1.0


def test_requests_past_the_timeout_fail_clearly():
    results, version = _run_retire([10.0, 10.0, 10.0], timeout=0.1)
    texts = _texts(results)
    running = version.scheduler.started
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


def test_streams_are_tracked_until_final_and_failed_when_abandoned():
    from pystub_backend.backend.response_stream import ResponseStream
    async def scenario() -> None:
        in_flight = InFlight()
        version: Any = FakeVersion()
        finished = ResponseStream("a", "m", lambda: None)
        lingering = ResponseStream("b", "m", lambda: None)
        in_flight.enter_stream(version, finished)
        in_flight.enter_stream(version, lingering)
        assert in_flight.count(version) == 2
        finished.fail(ServerError("done"))
        assert in_flight.count(version) == 1
        assert await in_flight.drain(version, 0.05) == 1
        in_flight.abandon(version, ServerError("unloaded"))
        assert in_flight.count(version) == 0
        response = await lingering.next()
        assert response is not None and response.error is not None and response.error.message == "unloaded"

    asyncio.run(scenario())
