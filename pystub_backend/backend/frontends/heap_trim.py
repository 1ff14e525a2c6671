"""Giving the memory a closed connection held back to the system (the h2 gRPC stack and HTTP).

What a connection holds (request bodies, the response frames libnghttp2 queues, the socket's write
buffer, the messages of its calls) is freed by reference counting the moment it closes. But glibc's malloc
keeps freed blocks in its heaps for reuse, and a heap gives pages back only from its top: after a
burst of streams whose clients did not read (each holding up to the high water of 64 KiB
messages), a frontend worker's RSS stayed tens of MiB above what it used, and the next burst,
allocating in a different order, grew it again. Each process also keeps tensor-sized freed blocks
on purpose (pystub_backend/ipc/heap.py), so a burst of large requests leaves it near its peak.
`malloc_trim(0)` returns the free pages inside every heap (glibc 2.8 and later): measured on such a
worker, 24 MiB back in 9 ms.

A trim costs milliseconds on the event loop, so it runs only after a connection that carried at
least `TRIM_AFTER_BYTES` closes, once for any number of such closes within `_INTERVAL` seconds.
Where the C library has no `malloc_trim` (musl, macOS) nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import time
from collections.abc import Callable

__all__ = ["HeapTrimmer", "TRIM_AFTER_BYTES"]

TRIM_AFTER_BYTES = 4 << 20  # a connection that carried less leaves too little behind to matter
_INTERVAL = 1.0  # at most one trim a second: its cost stays under 2 % of the loop
_SETTLE = 0.1  # the handlers the close cancelled unwind first (their buffers go with them)


def _malloc_trim() -> Callable[[], None] | None:
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


class HeapTrimmer:
    """One pending trim at a time on the running loop; `released()` asks for one."""

    def __init__(self, trim: Callable[[], None] | None = None) -> None:
        self._trim = trim if trim is not None else _malloc_trim()
        self._pending: asyncio.TimerHandle | None = None
        self._last = -_INTERVAL
        self.trims = 0

    def released(self) -> None:
        """A connection that carried much has closed: trim soon (coalesced with other closes)."""
        if self._trim is None or self._pending is not None:
            return
        delay = max(_SETTLE, self._last + _INTERVAL - time.monotonic())
        self._pending = asyncio.get_running_loop().call_later(delay, self._run)

    def _run(self) -> None:
        self._pending = None
        self._last = time.monotonic()
        self.trims += 1
        if self._trim is not None:
            self._trim()

    def cancel(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
