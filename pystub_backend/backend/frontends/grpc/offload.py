"""Work on received messages that may take longer than one turn of the event loop (inflating a
compressed message, splitting a large ModelInfer request) runs here, on two threads of its own.

The event loop answers every client, health checks included; a message that costs tens of
milliseconds to take apart must not hold them all. zlib lets go of the interpreter while it
inflates, so that runs beside the loop; the Python parts take the interpreter in turns of 5 ms
(`sys.getswitchinterval`). Two threads, not a pool per call: many such messages at once queue here
instead of each taking a thread that competes with the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

__all__ = ["off_loop", "OFF_LOOP_FROM_BYTES"]

_T = TypeVar("_T")
# Messages at least this large are taken apart off the loop; below it the thread hop costs more.
OFF_LOOP_FROM_BYTES = 64 << 10
_WORKERS = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="pystub-grpc-parse")


async def off_loop(work: Callable[..., _T], *args: object) -> _T:
    """`work(*args)` on the parsing threads; what it returns or raises."""
    return await asyncio.get_running_loop().run_in_executor(_WORKERS, work, *args)
