"""What one call receives: its request messages, in order, and the limits they are held to.

    flow control   the connection gives no window back on its own. Bytes of a message still
                   arriving are acknowledged at once (a message may be larger than any window);
                   once a whole message waits unread, further bytes are acknowledged only when the
                   handler takes it. A client streaming faster than its handler reads is thus held
                   to about one window.
    memory         every byte received counts against its connection's `MemoryBudget` until the
                   handler takes the message (a unary call's one message: until the call ends, the
                   handler holds it that long); a call that would take the budget over fails
                   RESOURCE_EXHAUSTED, its bytes dropped.
    compression    a compressed message is inflated when the handler takes it: the first MiB on
                   the event loop, the rest on a parsing thread (offload.py), its size checked
                   after each MiB against the receive limit and what the budget has left.
    read timeout   a call must have its first message (or its end) within the request-read timeout
                   of opening, else it ends DEADLINE_EXCEEDED; a streaming call is exempt once its
                   handler runs and no message is half-received.
    unary          exactly one message: none is INTERNAL "a unary call without its request
                   message", a second INTERNAL "Too many requests" (grpc-java's words; grpc core
                   answers such a call as if the second were not there).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

import grpc

from pystub_backend.backend.frontends.grpc.h2.wire import (
    Message,
    MessageReader,
    WireError,
    inflate_rest,
    inflate_start,
)
from pystub_backend.backend.frontends.grpc.offload import off_loop

__all__ = ["Inbound", "MemoryBudget", "TOO_MANY_REQUESTS", "NO_REQUEST"]

TOO_MANY_REQUESTS = "Too many requests"
NO_REQUEST = "a unary call without its request message"
_PREFIX = 5


class MemoryBudget:
    """The bytes one connection's calls may hold of what they received (`limit` < 0: no limit)."""

    __slots__ = ("limit", "held")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    @property
    def left(self) -> int:
        return -1 if self.limit < 0 else max(0, self.limit - self.held)

    def take(self, amount: int) -> bool:
        """Count `amount` more bytes held; False (nothing counted) when that is over the limit."""
        if 0 <= self.limit < self.held + amount:
            return False
        self.held += amount
        return True

    def give(self, amount: int) -> None:
        self.held -= amount

    def exhausted(self) -> WireError:
        return WireError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"the connection holds more than its limit of {self.limit} bytes of requests")


class Inbound:
    """The request side of one call; `acknowledge(n)` gives n bytes of window back."""

    def __init__(self, reader: MessageReader, budget: MemoryBudget, acknowledge: Callable[[int], None]) -> None:
        self._reader = reader
        self._budget = budget
        self._acknowledge = acknowledge
        self._messages: collections.deque[Message] = collections.deque()
        self._arrived: asyncio.Future[None] | None = None
        self._ended = False  # END_STREAM seen
        self._deferred = 0  # received bytes not yet acknowledged
        self._held = 0  # bytes counted in the budget for this call
        self._unary = False  # the handler took its one message
        self._failure: WireError | None = None
        self._read_timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._streaming = False  # the handler reads a stream (streaming())
        self.on_too_many: Callable[[], None] | None = None  # a unary call got a second message

    # -- from the connection --------------------------------------------------------------------
    def feed(self, data: bytes, end: bool) -> None:
        """DATA from the client (and END_STREAM with it)."""
        if data:
            if self._messages:  # the handler has not taken what came before: hold the window
                self._deferred += len(data)
            else:
                self._acknowledge(len(data))
            if self._failure is None:
                self._receive(data)
        if end:
            self._ended = True
        if self._messages or end or self._failure is not None:
            self._disarm_read_timer()
        self._wake()

    def _receive(self, data: bytes) -> None:
        if not self._budget.take(len(data)):
            self._failure = self._budget.exhausted()
            return
        self._held += len(data)
        try:
            self._messages.extend(self._reader.feed(data))
        except WireError as failure:
            self._failure = failure
            return
        if self._unary and self._messages and self.on_too_many is not None:
            self.on_too_many()

    def hold_headers(self, size: int) -> bool:
        """Count the call's header list against the budget (until the call ends); False when full."""
        if not self._budget.take(size):
            return False
        self._held += size
        return True

    def arm_read_timeout(self, seconds: float | None) -> None:
        """Start the request-read timeout, unless a message (or the end) is here already."""
        if seconds is not None and not self._messages and not self._ended and self._failure is None \
                and not self._closed and (not self._streaming or self._reader.partial):
            self._read_timer = asyncio.get_running_loop().call_later(seconds, self._read_late, seconds)

    def streaming(self) -> None:
        """The handler reads a stream: waiting for its first message is no longer bounded, unless
        one has begun to arrive."""
        self._streaming = True
        if not self._reader.partial:
            self._disarm_read_timer()

    def _read_late(self, seconds: float) -> None:
        self._read_timer = None
        if self._failure is None and not self._messages:
            self._failure = WireError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                      f"the request message did not arrive within {seconds:g} s")
            self._wake()

    def _disarm_read_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _wake(self) -> None:
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)

    # -- to the handler -------------------------------------------------------------------------
    async def next(self) -> bytes | None:
        """The next request message; None once the client has sent its last. Raises WireError."""
        while not self._messages:
            if self._failure is not None:
                raise self._failure
            if self._ended:
                if self._reader.partial:
                    raise WireError(grpc.StatusCode.INTERNAL, "the stream ended inside a message")
                return None
            self._arrived = asyncio.get_running_loop().create_future()
            try:
                await self._arrived
            finally:
                self._arrived = None
        flag, payload = self._messages.popleft()
        if self._deferred:
            self._acknowledge(self._deferred)
            self._deferred = 0
        message = await self._inflated(payload) if flag else payload
        if not self._unary:  # a streaming handler owns the message from here on (inflated: all of it)
            self._release(len(message) + _PREFIX)
        return message

    async def single(self) -> bytes:
        """The one message of a unary request. Raises WireError when there is not exactly one."""
        message = await self.next()
        if message is None:
            raise WireError(grpc.StatusCode.INTERNAL, NO_REQUEST)
        if self._messages:
            raise WireError(grpc.StatusCode.INTERNAL, TOO_MANY_REQUESTS)
        self._unary = True
        return message

    async def _inflated(self, payload: bytes) -> bytes:
        receive = self._reader.limit
        left = self._budget.left + len(payload) + _PREFIX if self._budget.limit >= 0 else -1
        budget_binds = left >= 0 and (receive < 0 or left < receive)
        limit = left if budget_binds else receive
        encoding = self._reader.encoding or "identity"
        try:
            whole, inflater, first = inflate_start(payload, encoding, limit)
            if whole is None:
                whole = await off_loop(inflate_rest, inflater, first, encoding, limit)
        except WireError as error:
            if budget_binds and error.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise self._budget.exhausted() from None
            raise
        grown = len(whole) - len(payload) - _PREFIX
        if not self._budget.take(grown):  # another call took what was left while this one inflated
            raise self._budget.exhausted()
        self._held += grown
        return whole

    # -- the end -------------------------------------------------------------------------------
    def close(self) -> None:
        """The call is over: what it held goes back to the budget, and bytes held back from a
        handler that stopped reading go back to the connection's window (else every such call
        would shrink it for good)."""
        self._closed = True
        self._disarm_read_timer()
        if self._deferred:
            self._acknowledge(self._deferred)
            self._deferred = 0
        self._messages.clear()
        self._release(self._held)
        self._wake()

    def _release(self, amount: int) -> None:
        amount = min(amount, self._held)
        self._held -= amount
        self._budget.give(amount)
