"""The model's own readiness check (`is_ready`, docs/reference/model-api.md#model-readiness): one call at a time per
stub.

    check ──▶ call in flight? ──no──▶ send IsReady(token) ──▶ [call] ◀── IsReadyDone(token)
                   │ yes                                        ▲
                   └──────────── wait for that same call ───────┘   (each check: at most 5 s)

A check waits at most `answer_timeout` (5 s, as Triton) and then reports NOT READY with Triton's
text, but the call it started stays in flight: the model's `is_ready()` is still running in the
stub, and a second call would only queue behind it (or pile up threads). Later checks wait for
that call instead of starting another, and the first answer it brings is theirs. Each call
carries a token and only the reply with that token answers it, so a reply that arrives after
its call was given up (the call's own deadline, or a dead stub) never answers a newer call.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import NamedTuple, Protocol, TypeVar

from pystub_backend.backend.supervision.errors import StubStartError
from pystub_backend.ipc.messages import core as msg

__all__ = ["ReadyProbe", "ReadyTransport", "TIMED_OUT", "ANSWER_TIMEOUT_SECONDS"]

log = logging.getLogger("pystub.supervisor")

TIMED_OUT = "Timed out waiting for user-defined is_ready() response"
ANSWER_TIMEOUT_SECONDS = 5.0
_R = TypeVar("_R")


class ReadyTransport(Protocol):
    """What the probe needs of a stub's link (supervision.frames.FrameLink): "send a message and
    wait (bounded) for a reply kind", and "wait (bounded) for a reply kind". Both raise
    StubStartError."""

    async def request_reply(self, message: NamedTuple, reply: type[_R], timeout: float, what: str) -> _R: ...

    async def await_reply(self, reply: type[_R], timeout: float, what: str) -> _R: ...


class ReadyProbe:
    """Asks one stub's model whether it is ready; see the module docstring."""

    def __init__(self, stub: ReadyTransport, instance_name: str, call_timeout: float) -> None:
        self._stub = stub
        self._name = instance_name
        self._call_timeout = call_timeout  # bounds one call: a model that never answers is given up
        self._tokens = itertools.count(1)
        self._call: asyncio.Future[str | None] | None = None
        self.calls = 0  # how many IsReady messages were sent (for tests and stubctl)

    async def check(self, answer_timeout: float = ANSWER_TIMEOUT_SECONDS) -> str | None:
        """None when the model says it is ready, else why not. Never raises."""
        if self._call is None or self._call.done():
            self._call = asyncio.ensure_future(self._ask())
        try:
            return await asyncio.wait_for(asyncio.shield(self._call), answer_timeout)
        except asyncio.TimeoutError:
            return TIMED_OUT

    async def _ask(self) -> str | None:
        """One IsReady call: send it, then take replies until the one with our token arrives."""
        token = next(self._tokens)
        self.calls += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._call_timeout
        try:
            reply = await self._stub.request_reply(msg.IsReady(token), msg.IsReadyDone, self._call_timeout,
                                                    "is_ready")
            while reply.token != token:
                log.debug("stub '%s': dropped an is_ready answer of an earlier call", self._name)
                reply = await self._stub.await_reply(msg.IsReadyDone, max(deadline - loop.time(), 0.001),
                                                      "is_ready")
        except StubStartError as exc:
            if "timed out" in str(exc):
                return TIMED_OUT
            return f"Stub process '{self._name}' is not healthy."
        return None if reply.ready else reply.error

