"""A stub's stdout and stderr, forwarded to the backend log once per line, prefixed with the
instance: `print()` in a model and uncaught tracebacks show up where operators look.

The pipes are read by the event loop (non-blocking), so a chatty model cannot stall the backend,
and a partial last line is flushed when the pipe closes.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import IO

__all__ = ["OutputForwarder"]

log = logging.getLogger("pystub.stub")
_MAX_LINE = 64 * 1024  # a line longer than this is logged in pieces


class _PipeReader:
    def __init__(self, pipe: IO[bytes], instance: str, level: int, done: asyncio.Future) -> None:
        self._pipe = pipe
        self._fd = pipe.fileno()
        self._instance = instance
        self._level = level
        self._done = done
        self._partial = b""
        os.set_blocking(self._fd, False)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._fd, self._readable)

    def _readable(self) -> None:
        try:
            chunk = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.close()
            return
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > _MAX_LINE:
            lines.append(self._partial)
            self._partial = b""
        for line in lines:
            self._emit(line)

    def _emit(self, line: bytes) -> None:
        log.log(self._level, "[%s] %s", self._instance, line.decode("utf-8", "replace").rstrip("\r"))

    def close(self) -> None:
        if self._done.done():
            return
        self._loop.remove_reader(self._fd)
        if self._partial:
            self._emit(self._partial)
            self._partial = b""
        self._pipe.close()
        self._done.set_result(None)


class OutputForwarder:
    """Forwards a process's stdout (INFO) and stderr (WARNING) lines to the `pystub_backend.stub.stub` log."""

    def __init__(self, instance: str, stdout: IO[bytes] | None, stderr: IO[bytes] | None) -> None:
        loop = asyncio.get_running_loop()
        self._readers: list[_PipeReader] = []
        self._done: list[asyncio.Future] = []
        for pipe, level in ((stdout, logging.INFO), (stderr, logging.WARNING)):
            if pipe is not None:
                done = loop.create_future()
                self._done.append(done)
                self._readers.append(_PipeReader(pipe, instance, level, done))

    async def drain(self, timeout: float) -> None:
        """Wait up to `timeout` s for the pipes to close (the process and anything it started
        exited), then stop reading."""
        if self._done:
            await asyncio.wait(self._done, timeout=timeout)
        for reader in self._readers:
            reader.close()
