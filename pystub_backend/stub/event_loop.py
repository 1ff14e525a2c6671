"""The per-instance asyncio loop on which `async def execute` coroutines run
(docs/reference/model-api.md#async-execute).

Created on first use on a daemon thread; coroutines are submitted with run_coroutine_threadsafe;
a failed coroutine's traceback is logged by a done-callback; finalize stops the loop.

asyncio re-raises SystemExit and KeyboardInterrupt out of `run_forever`, which would end the loop
thread and leave every later coroutine waiting forever; a model's `sys.exit()` in a coroutine is
therefore carried out of the loop as `EscapedExit` (an Exception) holding the original, which the
caller re-raises (`unwrap`) where it can be handled like any other failure of the model.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["InstanceLoop", "EscapedExit", "unwrap"]


class EscapedExit(Exception):  # noqa: N818 - it carries an exit, it is not an error of its own
    """A SystemExit or KeyboardInterrupt raised by a model's coroutine, carried out of the loop."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(f"{type(original).__name__}: {original}")
        self.original = original


def unwrap(exc: BaseException) -> BaseException:
    """The exception a model raised: the original of an EscapedExit, else `exc` itself."""
    return exc.original if isinstance(exc, EscapedExit) else exc


async def _contained(coroutine: Coroutine[Any, Any, Any]) -> Any:
    try:
        return await coroutine
    except (SystemExit, KeyboardInterrupt) as exc:
        raise EscapedExit(exc) from exc


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
        future = asyncio.run_coroutine_threadsafe(_contained(coroutine), self._ensure_started())
        future.add_done_callback(self._log_failure)
        return future

    def _log_failure(self, future: concurrent.futures.Future) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            exc = unwrap(exc)
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
