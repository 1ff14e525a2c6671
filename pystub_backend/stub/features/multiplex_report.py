"""Reports the changes of an instance's sub-model cache to the backend, in the order they happened.

The cache records each change under its lock (`hit`, `wait`, `loaded`, `failed`, `unloading`);
one daemon thread turns the records into frames, so model threads never block on the channel and
the backend sees the changes in the order the cache made them. Hits and waits are frequent and
only counted: they go out as one MultiplexUsage frame before the next change, or at the latest
`interval` seconds after the first of them.

An eviction is recorded when the entry leaves the cache but sent when `unload_multiplexed` has
returned, with its duration; the frames after it wait for it, so the backend never sees a later
load of the same id before its unload.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from pystub_backend.ipc.channel import ChannelClosedError
from pystub_backend.ipc.messages.multiplex import (
    MultiplexLoaded,
    MultiplexLoadFailed,
    MultiplexUnloaded,
    MultiplexUsage,
)

__all__ = ["Reporter", "Unloading"]

_HIT, _WAIT = "hit", "wait"


class Unloading:
    """An eviction in progress; `finish(seconds)` releases its frame."""

    __slots__ = ("model_id", "seconds", "_done")

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        self.seconds = 0.0
        self._done = threading.Event()

    def finish(self, seconds: float) -> None:
        self.seconds = seconds
        self._done.set()

    def wait(self) -> None:
        # No deadline: the unload runs in this process, and a model that hangs in it hangs its
        # execute too, which the backend's execute deadline and heartbeat checks already catch.
        self._done.wait()


class Reporter:
    def __init__(self, send: Callable[[Any], None], log_error: Callable[[str], None],
                 interval: float = 0.2) -> None:
        self._send = send
        self._log_error = log_error
        self._interval = interval
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    # -- called by the cache, under its lock (must not block) ------------------------------------
    def hit(self, model_id: str) -> None:
        self._put((_HIT, model_id))

    def wait(self, model_id: str) -> None:
        self._put((_WAIT, model_id))

    def loaded(self, model_id: str, seconds: float) -> None:
        self._put(MultiplexLoaded(model_id, seconds))

    def failed(self, model_id: str, seconds: float, error: str) -> None:
        self._put(MultiplexLoadFailed(model_id, seconds, error))

    def unloading(self, model_id: str) -> Unloading:
        record = Unloading(model_id)
        self._put(record)
        return record

    def _put(self, record: Any) -> None:
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="pystub-multiplex-report",
                                                    daemon=True)
                    self._thread.start()
        self._queue.put(record)

    # -- the reporting thread --------------------------------------------------------------------
    def _run(self) -> None:
        usage = _Usage()
        try:
            while True:
                timeout = None if usage.empty else max(0.0, usage.since + self._interval - time.monotonic())
                try:
                    record = self._queue.get(timeout=timeout)
                except queue.Empty:
                    self._flush(usage)
                    continue
                if type(record) is tuple:  # (kind, id); messages are NamedTuples, not plain tuples
                    usage.add(*record)
                    if time.monotonic() - usage.since >= self._interval:
                        self._flush(usage)
                    continue
                self._flush(usage)
                if isinstance(record, Unloading):
                    record.wait()
                    record = MultiplexUnloaded(record.model_id, record.seconds)
                self._send(record)
        except (ChannelClosedError, OSError):
            return  # the backend is gone; the stub is about to exit
        except Exception as exc:  # a bug here must not pass silently, nor kill the stub
            self._log_error(f"multiplexing reports stopped: {type(exc).__name__}: {exc}")

    def _flush(self, usage: _Usage) -> None:
        if not usage.empty:
            self._send(MultiplexUsage(usage.hits, usage.waits, list(usage.recent)))
            usage.clear()


class _Usage:
    """Hits and waits since the last report, and the ids they used in order of last use."""

    def __init__(self) -> None:
        self.recent: dict[str, None] = {}
        self.hits = self.waits = 0
        self.since = 0.0

    @property
    def empty(self) -> bool:
        return not self.recent

    def add(self, kind: str, model_id: str) -> None:
        if self.empty:
            self.since = time.monotonic()
        if kind == _HIT:
            self.hits += 1
        else:
            self.waits += 1
        self.recent.pop(model_id, None)
        self.recent[model_id] = None

    def clear(self) -> None:
        self.recent.clear()
        self.hits = self.waits = 0
