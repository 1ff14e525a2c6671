"""Supervision of the frontend worker processes, top to bottom in one place.

    start   spawn N workers (fresh interpreters: the core has threads, so no fork); wait, with a
            deadline that names the workers still missing, until each has said hello on the core
            link (it then listens on the public ports)
    watch   one task per worker awaits its exit; an unexpected exit is logged and the worker is
            started again after the stubs' restart back-off (supervision.restart_policy, with
            the server's restart settings); a worker is never given up on: the public ports must
            stay served
    stop    the stubs' stop ladder (supervision.stop_ladder) for every worker at once: SIGTERM
            (each stops accepting and finishes its in-flight requests), wait up to the grace
            period, SIGKILL what is left; the watchers reap
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import subprocess
import time
from collections.abc import Callable

from pystub_backend.backend.supervision.restart_policy import RestartPolicy
from pystub_backend.backend.supervision.settings import StubSettings
from pystub_backend.backend.supervision.stop_ladder import climb

__all__ = ["WorkerPool", "WorkerStartError"]

log = logging.getLogger("pystub.workers")
_REAP_SECONDS = 10.0  # after SIGKILL


def _exited(process: asyncio.subprocess.Process) -> bool:
    return process.returncode is not None


class WorkerStartError(RuntimeError):
    """The workers did not all listen before the deadline."""


class WorkerPool:
    """`count` workers, worker i started with `command(i)`; `restarts` holds the back-off settings."""

    def __init__(self, count: int, command: Callable[[int], list[str]], grace: float,
                 restarts: StubSettings) -> None:
        self._count = count
        self._command = command
        self._grace = grace
        self._restarts = restarts
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
        policy = RestartPolicy(self._restarts)
        while not self._stopping:
            process = await asyncio.create_subprocess_exec(*self._command(index), stdin=subprocess.DEVNULL)
            self._processes[index] = process
            code = await process.wait()
            if self._serving.get(index) == process.pid:
                del self._serving[index]
            if self._stopping:
                return
            policy.record_failure(time.monotonic())
            delay = policy.delay()
            log.warning("frontend worker %d (pid %d) exited with status %d; starting it again in %.1f s",
                        index, process.pid, code, delay)
            await asyncio.sleep(delay)

    async def stop(self) -> None:
        """Stop every worker (SIGTERM, grace, SIGKILL: the stop ladder) and reap it; idempotent."""
        self._stopping = True
        ladder = ((signal.SIGTERM, self._grace + 5.0), (signal.SIGKILL, _REAP_SECONDS))
        running = [(index, process) for index, process in self._processes.items() if process.returncode is None]
        await asyncio.gather(*(climb(process.pid, functools.partial(_exited, process), ladder,
                                     f"frontend worker {index}", log) for index, process in running))
        for watcher in self._watchers:
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        self._serving.clear()
