"""Supervision of the frontend worker processes, top to bottom in one place.

    start   spawn N workers (fresh interpreters: the core has threads, so no fork); wait, with a
            deadline that names the workers still missing, until each has said hello on the core
            link (it then listens on the public ports)
    watch   one task per worker awaits its exit; an unexpected exit is logged and the worker is
            started again after a backoff (0.1 s doubling to 5 s; back to 0.1 s after 10 s of life)
    stop    SIGTERM to every worker (each stops accepting and finishes its in-flight requests),
            wait up to the grace period, SIGKILL what is left, reap everything
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import subprocess
import time
from collections.abc import Callable

__all__ = ["WorkerPool", "WorkerStartError"]

log = logging.getLogger("pystub.workers")

_FIRST_BACKOFF = 0.1
_MAX_BACKOFF = 5.0
_HEALTHY_SECONDS = 10.0  # a worker that lived this long restarts with the first backoff again


class WorkerStartError(RuntimeError):
    """The workers did not all listen before the deadline."""


class WorkerPool:
    """`count` workers, worker i started with `command(i)`."""

    def __init__(self, count: int, command: Callable[[int], list[str]], grace: float) -> None:
        self._count = count
        self._command = command
        self._grace = grace
        self._processes: dict[int, asyncio.subprocess.Process] = {}
        self._serving: dict[int, int] = {}  # index -> pid of the worker that said hello
        self._changed = asyncio.Event()
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = False

    @property
    def pids(self) -> dict[int, int]:
        """Index -> pid of every worker now serving."""
        return dict(self._serving)

    def serving(self, index: int, pid: int) -> None:
        """A worker said hello on the core link: it listens."""
        self._serving[index] = pid
        self._changed.set()

    async def start(self, timeout: float) -> None:
        """Raises WorkerStartError when some worker is not serving after `timeout` seconds."""
        self._watchers = [asyncio.ensure_future(self._watch(index)) for index in range(self._count)]
        deadline = time.monotonic() + timeout
        while len(self._serving) < self._count:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(self._count)) - set(self._serving))
                raise WorkerStartError(f"timed out after {timeout:.0f} s waiting for frontend workers {missing} "
                                       "to listen on the HTTP/gRPC ports")
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def _watch(self, index: int) -> None:
        backoff = _FIRST_BACKOFF
        while not self._stopping:
            started = time.monotonic()
            process = await asyncio.create_subprocess_exec(*self._command(index), stdin=subprocess.DEVNULL)
            self._processes[index] = process
            code = await process.wait()
            if self._serving.get(index) == process.pid:
                del self._serving[index]
            if self._stopping:
                return
            if time.monotonic() - started >= _HEALTHY_SECONDS:
                backoff = _FIRST_BACKOFF
            log.warning("frontend worker %d (pid %d) exited with status %d; starting it again in %.1f s",
                        index, process.pid, code, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF)

    async def stop(self) -> None:
        """Stop every worker (SIGTERM, grace, SIGKILL) and reap it; idempotent."""
        self._stopping = True
        running = [process for process in self._processes.values() if process.returncode is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        waits = [asyncio.ensure_future(process.wait()) for process in running]
        if waits:
            _, late = await asyncio.wait(waits, timeout=self._grace + 5.0)
            for process in running:
                if process.returncode is None:
                    log.warning("frontend worker (pid %d) did not stop in time; killing it", process.pid)
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
            if late:
                await asyncio.wait(late, timeout=10.0)
        for watcher in self._watchers:
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        self._serving.clear()
