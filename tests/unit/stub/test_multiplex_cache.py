"""The stub's sub-model cache (pystub_backend/stub/features/multiplex.py,
pystub_backend/stub/features/multiplex_report.py) and its pb_utils
face: LRU order, eviction before load, one load per id under threads and coroutines, failed loads,
`__del__` of dropped sub-models, id validation, and the order of the reports to the backend."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from pystub_backend.ipc.messages.multiplex import (
    MultiplexLoaded,
    MultiplexLoadFailed,
    MultiplexUnloaded,
    MultiplexUsage,
)
from pystub_backend.stub import pb_utils
from pystub_backend.stub.event_loop import InstanceLoop
from pystub_backend.stub.features.multiplex import SubModelCache
from pystub_backend.stub.features.multiplex_report import Reporter
from pystub_backend.stub.pb_utils import _runtime


class SubModel:
    def __init__(self, model_id: str) -> None:
        self.model_id = model_id


class Model:
    """Loads take `delay` seconds; ids starting with "bad" fail; every call is logged."""

    def __init__(self, delay: float = 0.0, unload: bool = True) -> None:
        self.delay = delay
        self.log: list[str] = []
        self.lock = threading.Lock()
        if unload:
            self.unload_multiplexed = self._unload

    def load_multiplexed(self, model_id: str) -> SubModel:
        time.sleep(self.delay)
        with self.lock:
            self.log.append("load:" + model_id)
        if model_id.startswith("bad"):
            raise ValueError(f"no weights for {model_id}")
        return SubModel(model_id)

    def _unload(self, model_id: str, sub_model: SubModel) -> None:
        assert sub_model.model_id == model_id
        self.log.append("unload:" + model_id)


class AsyncModel(Model):
    async def load_multiplexed(self, model_id: str) -> SubModel:  # type: ignore[override]
        await asyncio.sleep(self.delay)
        self.log.append("load:" + model_id)
        if model_id.startswith("bad"):
            raise ValueError(f"no weights for {model_id}")
        return SubModel(model_id)


class Sent:
    """What the reporter sent, in order."""

    def __init__(self) -> None:
        self.messages: list[Any] = []

    def __call__(self, message: Any) -> None:
        self.messages.append(message)

    def settle(self, timeout: float = 2.0) -> list[Any]:
        time.sleep(0.3)  # hits and waits go out at most 0.2 s late
        return self.messages


@pytest.fixture
def loop() -> Any:
    instance_loop = InstanceLoop(lambda text: None)
    yield instance_loop
    instance_loop.stop()


def make(model: Any, loop: InstanceLoop, cap: int = 2) -> tuple[SubModelCache, Sent]:
    sent = Sent()
    return SubModelCache(model, cap, loop, Reporter(sent, print, interval=0.2), "m_0_0", print), sent


def test_lru_order_evicts_the_least_recently_used_before_loading(loop: InstanceLoop) -> None:
    model = Model()
    cache, sent = make(model, loop)
    for model_id in ["a", "b", "a", "c", "b"]:
        assert cache.get(model_id).model_id == model_id
    assert model.log == ["load:a", "load:b", "unload:b", "load:c", "unload:a", "load:b"]
    assert cache.held() == ["c", "b"]
    kinds = [(type(m).__name__, getattr(m, "model_id", None)) for m in sent.settle()]
    assert kinds == [("MultiplexLoaded", "a"), ("MultiplexLoaded", "b"), ("MultiplexUsage", None),
                     ("MultiplexUnloaded", "b"), ("MultiplexLoaded", "c"), ("MultiplexUnloaded", "a"),
                     ("MultiplexLoaded", "b")]
    usage = sent.messages[2]
    assert (usage.hits, usage.waits, usage.recent) == (1, 0, ["a"])


def test_concurrent_lookups_from_threads_share_one_load(loop: InstanceLoop) -> None:
    model = Model(delay=0.3)
    cache, sent = make(model, loop)
    with ThreadPoolExecutor(5) as pool:
        results = list(pool.map(cache.get, ["x"] * 5))
    assert all(result is results[0] for result in results)
    assert model.log == ["load:x"]
    usage = [m for m in sent.settle() if isinstance(m, MultiplexUsage)]
    assert sum(m.waits for m in usage) == 4


def test_concurrent_coroutines_share_one_async_load(loop: InstanceLoop) -> None:
    model = AsyncModel(delay=0.2)
    cache, sent = make(model, loop)

    async def many() -> list[Any]:
        return await asyncio.gather(*(cache.async_get(model_id) for model_id in ["x", "x", "y", "x"]))

    results = loop.submit(many()).result(5)
    assert results[0] is results[1] is results[3] and results[2].model_id == "y"
    assert sorted(model.log) == ["load:x", "load:y"]
    # A sync load in a coroutine runs in a worker thread: other coroutines go on meanwhile.
    sync_cache, _ = make(Model(delay=0.2), loop)

    async def overlapped() -> float:
        started = time.monotonic()
        await asyncio.gather(sync_cache.async_get("p"), sync_cache.async_get("q"))
        return time.monotonic() - started

    assert loop.submit(overlapped()).result(5) < 0.35


def test_a_failed_load_fails_every_waiter_and_caches_nothing(loop: InstanceLoop) -> None:
    model = Model(delay=0.2)
    cache, sent = make(model, loop)
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(cache.get, "bad-1") for _ in range(3)]
        errors = [future.exception(5) for future in futures]
    for error in errors:
        assert isinstance(error, pb_utils.TritonModelException)
        assert str(error) == "Failed to load multiplexed model 'bad-1': ValueError: no weights for bad-1"
    assert len({id(error) for error in errors}) == 3  # each waiter raises its own exception
    assert model.log == ["load:bad-1"] and cache.held() == []
    with pytest.raises(pb_utils.TritonModelException):
        cache.get("bad-1")
    assert model.log == ["load:bad-1", "load:bad-1"]  # nothing cached: tried again
    failed = [m for m in sent.settle() if isinstance(m, MultiplexLoadFailed)]
    assert [m.model_id for m in failed] == ["bad-1", "bad-1"] and "no weights" in failed[0].error


def test_without_unload_hook_the_cache_drops_its_reference(loop: InstanceLoop) -> None:
    model = Model(unload=False)
    cache, sent = make(model, loop, cap=1)
    first = weakref.ref(cache.get("a"))
    gc.collect()
    assert first() is not None
    cache.get("b")
    gc.collect()
    assert first() is None  # nothing else held it: `__del__` ran
    assert any(isinstance(m, MultiplexUnloaded) and m.model_id == "a" for m in sent.settle())


def test_a_blocking_lookup_in_a_coroutine_is_refused(loop: InstanceLoop) -> None:
    cache, _ = make(Model(), loop)

    async def blocking() -> Any:
        return cache.get("a")

    with pytest.raises(pb_utils.TritonModelException, match="async_get_multiplexed_model"):
        loop.submit(blocking()).result(5)


def test_an_unload_that_raises_is_logged_and_the_entry_still_leaves(loop: InstanceLoop) -> None:
    model = Model()
    errors: list[str] = []

    def failing(model_id: str, sub_model: Any) -> None:
        raise RuntimeError("busy")

    model.unload_multiplexed = failing
    cache = SubModelCache(model, 1, loop, Reporter(lambda m: None, print), "m_0_0", errors.append)
    cache.get("a")
    cache.get("b")
    assert cache.held() == ["b"] and errors == ["unload_multiplexed('a') of 'm_0_0' raised RuntimeError: busy"]


def test_the_unloaded_report_waits_for_the_unload_so_reports_keep_their_order() -> None:
    sent = Sent()
    reporter = Reporter(sent, print, interval=0.05)
    record = reporter.unloading("a")
    reporter.loaded("a", 0.5)
    time.sleep(0.1)
    assert sent.messages == []
    record.finish(0.25)
    time.sleep(0.1)
    assert sent.messages == [MultiplexUnloaded("a", 0.25), MultiplexLoaded("a", 0.5)]


# -- pb_utils ----------------------------------------------------------------------------------------


class Request:
    def __init__(self, parameters: str) -> None:
        self._parameters = parameters

    def parameters(self) -> str:
        return self._parameters


def test_pb_utils_lookups(loop: InstanceLoop) -> None:
    request = Request('{"multiplexed_model_id": "a", "other": 1}')
    assert pb_utils.get_multiplexed_model_id(request) == "a"
    assert pb_utils.get_multiplexed_model_id(Request("{}")) == ""
    with pytest.raises(pb_utils.TritonModelException, match="MAX_MULTIPLEXED_MODELS"):
        pb_utils.get_multiplexed_model(request)
    cache, _ = make(Model(), loop)
    _runtime.set_multiplexer(cache)
    try:
        assert pb_utils.get_multiplexed_model(request).model_id == "a"
        assert pb_utils.get_multiplexed_model("b").model_id == "b"  # an id string works too
        assert loop.submit(pb_utils.async_get_multiplexed_model(request)).result(5).model_id == "a"
        with pytest.raises(pb_utils.TritonModelException, match="has no 'multiplexed_model_id' parameter"):
            pb_utils.get_multiplexed_model(Request("{}"))
        with pytest.raises(pb_utils.TritonModelException, match="must not be empty"):
            pb_utils.get_multiplexed_model("")
        with pytest.raises(pb_utils.TritonModelException, match="at most 256 characters, got 300"):
            pb_utils.get_multiplexed_model("x" * 300)
    finally:
        _runtime.set_multiplexer(None)
