"""The infer-payload registry: every request the backend issued on a stub's behalf (BLS) and has not
finished, by id.

    key = (caller stub's shm base name, the stub's call id)      unique per stub incarnation

python_be keeps the same table (`infer_payload_`) behind a mutex because its frontends, its event
loop and its queue-receiver threads all touch it; pystub's frame handlers run on the event loop,
but the registry is also read from other threads (admin facts, tests), so it keeps the lock and
every method is thread-safe.

An entry is added when the BLS request frame arrives and removed when its final response has been
sent, when the stub cancels it and it has wound down, or when the calling stub died (the sweeper
notices within `SWEEP_SECONDS` and tells the payload, which cancels its target request). A payload
is a `Payload`: a `caller` (the StubProcess), `caller_died()`, `cancel()` and `credit(n)`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pystub_backend.backend.inference import InferRequest
    from pystub_backend.backend.supervision.stub_process import StubProcess

__all__ = ["PayloadRegistry", "PayloadKey", "Payload", "REGISTRY", "SWEEP_SECONDS"]

log = logging.getLogger("pystub.bls")

PayloadKey = tuple[str, int]
SWEEP_SECONDS = 0.25


class Payload(Protocol):
    """What the registry needs of a call in flight (features.bls.call.BlsCall)."""

    @property
    def caller(self) -> StubProcess: ...

    @property
    def request(self) -> InferRequest: ...

    @property
    def holding(self) -> bool: ...

    def caller_died(self) -> None: ...

    def cancel(self) -> None: ...

    def credit(self, count: int = 1) -> None: ...


class PayloadRegistry:
    def __init__(self) -> None:
        self._entries: dict[PayloadKey, Payload] = {}
        self._lock = threading.Lock()
        self._sweeper: asyncio.Task[None] | None = None

    def add(self, key: PayloadKey, payload: Payload) -> None:
        """Register `payload`. Raises KeyError when the key is taken (a stub reused a call id)."""
        with self._lock:
            if key in self._entries:
                raise KeyError(f"BLS call {key[1]} of stub '{key[0]}' is already in flight")
            self._entries[key] = payload
        self._ensure_sweeper()

    def get(self, key: PayloadKey) -> Payload | None:
        with self._lock:
            return self._entries.get(key)

    def remove(self, key: PayloadKey, payload: Payload | None = None) -> None:
        """Drop the entry (only if it is still `payload`, when given)."""
        with self._lock:
            if payload is None or self._entries.get(key) is payload:
                self._entries.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def payloads(self) -> list[Payload]:
        with self._lock:
            return list(self._entries.values())

    def of_caller(self, caller: StubProcess) -> Iterator[Payload]:
        return (payload for payload in self.payloads() if payload.caller is caller)

    # -- the sweeper: callers that died ------------------------------------------------------------
    def _ensure_sweeper(self) -> None:
        if self._sweeper is not None and not self._sweeper.done():
            return
        try:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        except RuntimeError:  # no loop (unit tests of the table alone): nothing to sweep for
            self._sweeper = None

    async def _sweep(self) -> None:
        # Runs while entries exist. A stub's death is seen at once by its own channel, but that
        # news goes to its supervisor; polling `alive` keeps the registry independent of it.
        while len(self):
            await asyncio.sleep(SWEEP_SECONDS)
            for payload in self.payloads():
                if not payload.caller.alive:
                    try:
                        payload.caller_died()
                    except Exception:  # one broken payload must not stop the sweep
                        log.exception("failed to end a BLS call of a dead stub")


REGISTRY = PayloadRegistry()
