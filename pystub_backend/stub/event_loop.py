"""The per-instance asyncio loop on which `async def execute` coroutines run (API.md section 8).

Created on first use on a daemon thread; coroutines are submitted with run_coroutine_threadsafe;
a failed coroutine's traceback is logged by a done-callback; finalize stops the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["InstanceLoop"]


class InstanceLoop:
    def __init__(self, log_error: Callable[[str], None]) -> None:
        self._log_error = log_error
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="pystub-async-execute", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> concurrent.futures.Future:
        """Schedule `coroutine`; failures are logged with their traceback when it completes."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._ensure_started())
        future.add_done_callback(self._log_failure)
        return future

    def _log_failure(self, future: concurrent.futures.Future) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            self._log_error(f"Failed to run a coroutine of the model: {type(exc).__name__}: {exc}\n{text}")

    def stop(self, timeout: float = 5.0) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if not thread.is_alive():
            loop.close()
