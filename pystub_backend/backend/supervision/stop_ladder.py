"""The stop ladder, written once: how a supervised process is made to exit, every step bounded.
Stubs (stub_process.py) and frontend workers (worker_pool/pool.py) both climb it.

    for (signal, grace) in ladder:      e.g. (None, 2.0), (SIGTERM, 1.0), (SIGKILL, 5.0)
        exited? ─▶ done                 (None: only wait, the process was asked to exit already)
        send signal, wait up to grace   (polled: the caller reaps, so nothing here blocks)
    still running after the last step ─▶ logged as an error, `False`

Stubs get their signals as a process group (they run in their own session, with whatever the
model started); a worker is one process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence

__all__ = ["Step", "climb"]

Step = tuple[signal.Signals | None, float]  # (signal to send or None, seconds to wait for the exit)
_POLL_SECONDS = 0.01


async def climb(pid: int, exited: Callable[[], bool], ladder: Sequence[Step], what: str, log: logging.Logger, *,
                group: bool = False, extra: Mapping[str, object] | None = None) -> bool:
    """Walk `ladder` until `exited()`; `what` names the process in `log`'s lines ("stub 'm_0'").
    Returns whether it exited. Never raises: a process already gone is simply gone."""
    send = os.killpg if group else os.kill
    for sig, grace in ladder:
        if sig is not None and not exited():
            log.info("sending %s to %s (pid %d)", sig.name, what, pid, extra=extra)
            try:
                send(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while not exited() and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_SECONDS)
        if exited():
            return True
    log.error("%s (pid %d) did not exit after %s", what, pid, ladder[-1][0].name if ladder[-1][0] else "waiting")
    return False
