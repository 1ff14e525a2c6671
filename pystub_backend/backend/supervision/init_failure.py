"""What a load reports when a stub dies inside the model's `initialize` (os._exit, a signal).

Triton fails the load with `Stub process '<instance>' is not healthy.` (its log:
`failed to load '<model>' version 1: Internal: Stub process '<model>_0' is not healthy.`); pystub
uses the same text and logs how the process ended (exit code or signal) on a line of its own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

__all__ = ["died_during_initialize"]

log = logging.getLogger("pystub.supervisor")


class _Stub(Protocol):
    """The facts of a StubProcess this needs."""

    instance_name: str

    @property
    def alive(self) -> bool: ...

    def death_reason(self) -> str: ...

    @property
    def exit_code(self) -> int | None: ...


_REAP_WAIT_SECONDS = 1.0  # the channel closes a moment before the process can be reaped


async def died_during_initialize(stub: _Stub, error: Exception) -> str:
    """The load error for a stub whose `initialize` did not answer: Triton's `Stub process
    '<instance>' is not healthy.` when the process died (os._exit, a signal), with how it died
    (exit code or signal, once the process is reaped) logged on its own line; the original text
    (a timeout) otherwise."""
    if stub.alive:
        return str(error)
    deadline = time.monotonic() + _REAP_WAIT_SECONDS
    while stub.exit_code is None and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    log.error("stub '%s' %s during initialize", stub.instance_name, stub.death_reason())
    return f"Stub process '{stub.instance_name}' is not healthy."
