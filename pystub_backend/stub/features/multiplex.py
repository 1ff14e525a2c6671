"""Model multiplexing in the stub (pystub extension): an LRU cache of sub-models per instance.

A model opts in by defining `load_multiplexed(self, model_id)` (sync or async) and, optionally,
`unload_multiplexed(self, model_id, sub_model)`, and by setting the config parameter
`MAX_MULTIPLEXED_MODELS`. In `execute` it asks `pb_utils.get_multiplexed_model(request)` (or
`await pb_utils.async_get_multiplexed_model(request)` in an `async def execute`) for the sub-model
of the request's `multiplexed_model_id`:

    hit       the id is held: it becomes the most recently used, its sub-model is returned
    wait      the id is being loaded (by another thread or coroutine): wait for that load
    miss      evict least recently used entries until the new one fits, load it, keep it

Only one load per id runs at a time: every lookup of the id during the load gets that load's
result. A failed load raises TritonModelException in each lookup that waited for it and caches
nothing, so the next lookup tries again. An evicted sub-model is passed to `unload_multiplexed`
when the model has one; otherwise the cache drops its reference and Python runs its `__del__`
once no request uses it any more. Every change is reported to the backend (`multiplex_report`),
which routes requests to the instances that hold their id.

The backend configures the cache with a MultiplexConfigure frame before the first EXECUTE.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import inspect
import threading
import time
from typing import Any

from pystub_backend.ipc.messages.multiplex import MultiplexConfigure
from pystub_backend.stub.event_loop import InstanceLoop
from pystub_backend.stub.features.multiplex_report import Reporter, Unloading
from pystub_backend.stub.handlers import StubHandlers
from pystub_backend.stub.pb_utils import TritonModelException, _runtime

__all__ = ["SubModelCache", "register"]

_HIT, _WAIT, _LOAD = 0, 1, 2
_Evicted = list[tuple[str, Any, Unloading]]


class _LoadFailed(Exception):
    """Carries the text every lookup that waited for a failed load raises (each its own error)."""


class SubModelCache:
    def __init__(self, model: Any, cap: int, loop: InstanceLoop, reporter: Reporter, instance: str,
                 log_error: Any) -> None:
        self._model = model
        self._cap = max(1, int(cap))
        self._loop = loop
        self._reporter = reporter
        self._instance = instance
        self._log_error = log_error
        self._lock = threading.Lock()
        self._held: collections.OrderedDict[str, Any] = collections.OrderedDict()  # LRU first
        self._loading: dict[str, concurrent.futures.Future] = {}

    @property
    def cap(self) -> int:
        return self._cap

    def held(self) -> list[str]:
        """The ids held now, least recently used first."""
        with self._lock:
            return list(self._held)

    # -- lookups -----------------------------------------------------------------------------------
    def get(self, model_id: str) -> Any:
        """The sub-model for `model_id`, loading it on a miss; blocks while it loads.

        Raises TritonModelException when the load fails, when the model defines no
        `load_multiplexed`, or when called on a running event loop (use `async_get` there).
        """
        if _on_running_loop():
            raise TritonModelException(
                "pb_utils.get_multiplexed_model() blocks; in an 'async def execute' use "
                "'await pb_utils.async_get_multiplexed_model(...)'")
        kind, value = self._claim(model_id)
        if kind == _HIT:
            return value
        if kind == _LOAD:
            future, evicted = value
            self._unload_all(evicted)
            self._load(model_id, future)
            value = future
        # No deadline: the load runs in this process; one that hangs hangs its execute, which the
        # backend's execute deadline (EXECUTE_TIMEOUT_SECONDS) and heartbeat checks catch.
        return _result(value.result)

    async def async_get(self, model_id: str) -> Any:
        """`get` for coroutines: the instance's event loop keeps running while the sub-model loads
        (a sync `load_multiplexed` runs in a worker thread). Raises like `get`."""
        kind, value = self._claim(model_id)
        if kind == _HIT:
            return value
        if kind == _LOAD:
            future, evicted = value
            await self._async_unload_all(evicted)
            await self._async_load(model_id, future)
            value = future
        return await _awaited(asyncio.wrap_future(value))

    def _claim(self, model_id: str) -> tuple[int, Any]:
        """(_HIT, sub-model), (_WAIT, the load's future) or (_LOAD, (new future, evicted))."""
        if not callable(getattr(self._model, "load_multiplexed", None)):
            raise TritonModelException(f"model instance '{self._instance}' uses multiplexing but does not "
                                       f"define load_multiplexed(self, model_id)")
        with self._lock:
            if model_id in self._held:
                self._held.move_to_end(model_id)
                self._reporter.hit(model_id)
                return _HIT, self._held[model_id]
            future = self._loading.get(model_id)
            if future is not None:
                self._reporter.wait(model_id)
                return _WAIT, future
            future = concurrent.futures.Future()
            self._loading[model_id] = future
            # Evict before loading: the new sub-model's memory is freed first. Entries still
            # loading count against the cap but cannot be evicted; `_commit` evicts again.
            return _LOAD, (future, self._evict(len(self._loading)))

    def _evict(self, reserved: int) -> _Evicted:
        """Pop LRU entries until held + `reserved` fit the cap; call with the lock held."""
        evicted = []
        while self._held and len(self._held) + reserved > self._cap:
            model_id, sub_model = self._held.popitem(last=False)
            evicted.append((model_id, sub_model, self._reporter.unloading(model_id)))
        return evicted

    # -- loading -----------------------------------------------------------------------------------
    def _load(self, model_id: str, future: concurrent.futures.Future) -> None:
        started = time.monotonic()
        try:
            sub_model = self._model.load_multiplexed(model_id)
            if inspect.isawaitable(sub_model):
                sub_model = self._loop.submit(_await(sub_model)).result()
        except BaseException as exc:  # even SystemExit: the lookups waiting for this load must end
            self._fail(model_id, future, exc, started)
            if not isinstance(exc, Exception):
                raise
            return
        self._unload_all(self._commit(model_id, future, sub_model, started))

    async def _async_load(self, model_id: str, future: concurrent.futures.Future) -> None:
        started = time.monotonic()
        try:
            load = self._model.load_multiplexed
            if inspect.iscoroutinefunction(load):
                sub_model = await load(model_id)
            else:
                sub_model = await asyncio.to_thread(load, model_id)
                if inspect.isawaitable(sub_model):
                    sub_model = await sub_model
        except BaseException as exc:  # a cancelled load too: the lookups waiting for it must end
            self._fail(model_id, future, exc, started)
            if not isinstance(exc, Exception):
                raise
            return
        await self._async_unload_all(self._commit(model_id, future, sub_model, started))

    def _commit(self, model_id: str, future: concurrent.futures.Future, sub_model: Any,
                started: float) -> _Evicted:
        with self._lock:
            del self._loading[model_id]
            self._held[model_id] = sub_model
            self._reporter.loaded(model_id, time.monotonic() - started)
            evicted = self._evict(0)  # concurrent loads of other ids may have overfilled it
        future.set_result(sub_model)
        return evicted

    def _fail(self, model_id: str, future: concurrent.futures.Future, exc: BaseException, started: float) -> None:
        text = f"Failed to load multiplexed model '{model_id}': {type(exc).__name__}: {exc}"
        with self._lock:
            del self._loading[model_id]
            self._reporter.failed(model_id, time.monotonic() - started, text)
        future.set_exception(_LoadFailed(text))

    # -- unloading ---------------------------------------------------------------------------------
    def _unload_all(self, evicted: _Evicted) -> None:
        while evicted:
            model_id, sub_model, record = evicted.pop(0)
            started = time.monotonic()
            try:
                unload = getattr(self._model, "unload_multiplexed", None)
                if unload is not None:
                    result = unload(model_id, sub_model)
                    if inspect.isawaitable(result):
                        self._loop.submit(_await(result)).result()
            except Exception as exc:
                self._unload_failed(model_id, exc)
            finally:
                del sub_model  # the last reference, unless a request still uses it: __del__ runs now
                record.finish(time.monotonic() - started)

    async def _async_unload_all(self, evicted: _Evicted) -> None:
        while evicted:
            model_id, sub_model, record = evicted.pop(0)
            started = time.monotonic()
            try:
                unload = getattr(self._model, "unload_multiplexed", None)
                if inspect.iscoroutinefunction(unload):
                    await unload(model_id, sub_model)
                elif unload is not None:
                    result = await asyncio.to_thread(unload, model_id, sub_model)
                    if inspect.isawaitable(result):
                        await result
            except Exception as exc:
                self._unload_failed(model_id, exc)
            finally:
                del sub_model
                record.finish(time.monotonic() - started)

    def _unload_failed(self, model_id: str, exc: Exception) -> None:
        # The entry is gone either way: a failed unload must not keep the id counted as held.
        self._log_error(f"unload_multiplexed('{model_id}') of '{self._instance}' raised "
                        f"{type(exc).__name__}: {exc}")


def _result(result: Any) -> Any:
    try:
        return result()
    except _LoadFailed as failed:
        raise TritonModelException(str(failed)) from None


async def _awaited(future: asyncio.Future) -> Any:
    try:
        return await future
    except _LoadFailed as failed:
        raise TritonModelException(str(failed)) from None


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _on_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _configure(stub: Any, message: MultiplexConfigure) -> None:
    """Install the instance's cache (once per stub; the backend sends this before any EXECUTE)."""
    if _runtime.multiplexer() is not None:
        return
    if not callable(getattr(stub.model, "load_multiplexed", None)):
        stub.log_error(f"model instance '{stub.instance}' sets MAX_MULTIPLEXED_MODELS but does not define "
                       f"load_multiplexed(self, model_id)")
    reporter = Reporter(stub.send, stub.log_error)
    _runtime.set_multiplexer(SubModelCache(stub.model, message.cap, stub.loop, reporter, stub.instance,
                                           stub.log_error))


def register(handlers: StubHandlers) -> None:
    """Wire multiplexing into a stub: the sub-model cache, installed by the backend's configure."""
    handlers.on_main(MultiplexConfigure, _configure)
