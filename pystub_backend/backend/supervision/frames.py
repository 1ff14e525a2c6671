"""The frame link to one stub: the one place that sends to a stub with a deadline, and the
dispatcher of the frames the stub sends back.

    send(message, timeout)   await room in the stub's queue, at most `timeout` s (default: the stub
                             timeout); raises ChannelTimeoutError naming the message and the stub,
                             ChannelClosedError when the stub is gone
    try_send(message)        send now if there is room, else False (nothing sent); never waits
    send_soon(message)       never blocks: sent at once when there is room, else from a task bounded
                             by the stub timeout, in order behind earlier `send_soon` frames;
                             failures are logged (for replies and notices nobody awaits)
    flush()                  wait until every `send_soon` frame went out (or was given up)
    request_reply(...)       send and wait for the reply of a given class (INIT, IS_READY, ...)
    await_reply(...)         wait for such a reply without sending (one wait, shared with the above)

A frame over the channel's limit (a request with megabytes of metadata) is written into the p2s
arena and sent as SPILLED (pystub_backend.ipc.spill); the stub RELEASEs it once read. A SPILLED
frame from the stub is read from s2p, released at once, and dispatched like any other frame.

Incoming frames: the request frames (RESPONSE, EXECUTE_DONE, RELEASE) go to the request exchange,
LOG to the backend log, feature frames to the server's BackendHandlers, replies to their waiter.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

from pystub_backend.backend.supervision.errors import StubStartError
from pystub_backend.ipc import spill
from pystub_backend.ipc.arena import ArenaFullError
from pystub_backend.ipc.channel import AsyncChannel, ChannelClosedError, ChannelTimeoutError
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.messages.to_backend import ToBackend, is_to_backend

if TYPE_CHECKING:
    from pystub_backend.backend.supervision.stub_process import StubProcess

__all__ = ["FrameLink"]

_Reply = TypeVar("_Reply")

log = logging.getLogger("pystub.stub")
_LOG_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}


class FrameLink:
    def __init__(self, stub: StubProcess, timeout: float) -> None:
        self._stub = stub
        self._timeout = timeout
        self.channel: AsyncChannel | None = None
        self._waiters: dict[type, asyncio.Future[object]] = {}
        self._last_soon: asyncio.Task[None] | None = None
        self._soon_tasks: set[asyncio.Task[None]] = set()

    def open(self, sock: socket.socket, on_closed: Callable[[], None]) -> None:
        self.channel = AsyncChannel(sock, self._on_frame, on_closed)

    @property
    def closed(self) -> bool:
        return self.channel is None or self.channel.closed

    # -- sending -----------------------------------------------------------------------------------
    def _what(self, message: NamedTuple) -> str:
        return f"{type(message).__name__} to stub '{self._stub.instance_name}'"

    def _frame(self, message: NamedTuple) -> tuple[bytes, list[int] | None]:
        """The frame for `message`, and the p2s handle it was spilled into when it is over the
        limit (else None). Raises ArenaFullError when p2s cannot hold it, and what `encode` raises
        for a value the wire cannot carry."""
        frame = msg.encode(message)
        if spill.fits(frame):
            return frame, None
        p2s = self._stub.p2s
        if p2s is None:
            raise ChannelClosedError(f"stub '{self._stub.instance_name}' has no arena")
        return spill.spill(frame, p2s)

    async def send(self, message: NamedTuple, timeout: float | None = None) -> None:
        """Send `message`, waiting at most `timeout` s (default: the stub timeout) for room.

        Raises ChannelTimeoutError (naming the message and the stub), ChannelClosedError,
        ArenaFullError (a frame over the limit that p2s cannot hold), and TypeError, ValueError or
        OverflowError for a value the wire cannot carry."""
        if self.channel is None:
            raise ChannelClosedError(f"stub '{self._stub.instance_name}' has no channel")
        frame, spilled = self._frame(message)
        try:
            await self.channel.send(frame, self._timeout if timeout is None else timeout, self._what(message))
        except (ChannelClosedError, ChannelTimeoutError):
            self._unsent(spilled)
            raise

    def try_send(self, message: NamedTuple) -> bool:
        """Send `message` now if the stub's queue has room; False (nothing sent) if it is full.
        Raises as `send` does, but never ChannelTimeoutError."""
        if self.channel is None:
            raise ChannelClosedError(f"stub '{self._stub.instance_name}' has no channel")
        frame, spilled = self._frame(message)
        try:
            if self.channel.try_send(frame):
                return True
        except ChannelClosedError:
            self._unsent(spilled)
            raise
        self._unsent(spilled)
        return False

    def send_soon(self, message: NamedTuple) -> None:
        """Send `message` in order with earlier `send_soon` frames; never blocks, never raises."""
        channel = self.channel
        if channel is None or channel.closed:
            return
        try:
            frame, spilled = self._frame(message)
        except (ArenaFullError, ChannelClosedError, TypeError, ValueError, OverflowError) as exc:
            log.warning("could not send %s: %s", self._what(message), exc)
            return
        previous = self._last_soon
        if previous is None or previous.done():
            try:
                if channel.try_send(frame):
                    return
            except ChannelClosedError:
                self._unsent(spilled)
                return
            previous = None
        task = asyncio.ensure_future(self._send_later(channel, frame, spilled, self._what(message), previous))
        self._last_soon = task
        self._soon_tasks.add(task)
        task.add_done_callback(self._soon_tasks.discard)

    async def _send_later(self, channel: AsyncChannel, frame: bytes, spilled: list[int] | None, what: str,
                          previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await asyncio.wait({previous})  # keep the frames in the order they were sent
        try:
            await channel.send(frame, self._timeout, what)
        except (ChannelClosedError, ChannelTimeoutError) as exc:
            self._unsent(spilled)
            log.warning("could not send %s: %s", what, exc)

    def _unsent(self, spilled: list[int] | None) -> None:
        """A spilled frame that was never sent: free its p2s bytes (the stub cannot release them)."""
        if spilled is not None:
            self._stub.exchange.free_p2s([spilled])

    async def flush(self) -> None:
        """Wait until every frame `send_soon` queued has been sent (or given up); returns at once
        in the usual case, where they went out immediately."""
        last = self._last_soon
        if last is not None and not last.done():
            await asyncio.wait({last})

    # -- replies -----------------------------------------------------------------------------------
    async def request_reply(self, message: NamedTuple, reply: type[_Reply], timeout: float, what: str) -> _Reply:
        """Send `message` and return the stub's `reply`-class answer. Raises StubStartError when
        the stub dies or `timeout` s pass (the text names `what`)."""
        return await self._wait_reply(reply, timeout, what, message)

    async def await_reply(self, reply: type[_Reply], timeout: float, what: str) -> _Reply:
        """Wait for the next `reply`-class answer without sending anything (config-sections hook:
        the ready probe drops a late answer of an earlier call and waits on). Raises as
        `request_reply`."""
        return await self._wait_reply(reply, timeout, what, None)

    async def _wait_reply(self, reply: type[_Reply], timeout: float, what: str,
                          message: NamedTuple | None) -> _Reply:
        """The one wait for a reply: the waiter is registered before `message` (if any) is sent,
        so the answer cannot arrive unseen; it is removed however the wait ends."""
        if self.closed:
            raise StubStartError(self._stub.death_text(what))
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._waiters[reply] = future
        try:
            if message is not None:
                try:
                    await self.send(message)
                except (ChannelClosedError, ChannelTimeoutError, ArenaFullError) as exc:
                    raise StubStartError(f"{self._stub.death_text(what)} ({exc})") from exc
            try:
                return cast(_Reply, await asyncio.wait_for(future, timeout))
            except asyncio.TimeoutError:
                raise StubStartError(f"timed out after {timeout:.0f} s waiting for {what} from stub "
                                     f"'{self._stub.instance_name}'") from None
        finally:
            if self._waiters.get(reply) is future:
                del self._waiters[reply]

    def fail_waiters(self) -> None:
        """The stub is gone: every reply waiter learns it now."""
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(StubStartError(self._stub.death_text("a reply")))

    # -- receiving ---------------------------------------------------------------------------------
    def _on_frame(self, frame: bytes) -> None:
        try:
            message = msg.decode(frame)
            if type(message) is msg.Spilled:
                message = self._unspill(message)
        except msg.MessageDecodeError as exc:
            log.error("dropped a corrupt frame from stub '%s': %s", self._stub.instance_name, exc)
            return
        if not is_to_backend(message):  # a kind only the backend sends
            self._unexpected(type(message))
            return
        try:
            self._dispatch(message)
        except Exception as exc:  # noqa: BLE001 - a malformed frame must not end the channel's reader
            log.error("dropped a malformed %s frame from stub '%s': %s: %s", type(message).__name__,
                      self._stub.instance_name, type(exc).__name__, exc)

    def _unspill(self, message: msg.Spilled) -> Any:
        """The message a SPILLED frame names in s2p; its bytes are released at once (copied out)."""
        s2p = self._stub.s2p
        if s2p is None:
            raise msg.MessageDecodeError("a spilled frame arrived before the s2p arena exists")
        return spill.unspill(message, s2p, lambda handle: self._stub.exchange.outbox.release([handle]))

    def _dispatch(self, message: ToBackend) -> None:
        kind = type(message)
        exchange = self._stub.exchange
        if isinstance(message, msg.Response):
            exchange.on_response(message.response)
        elif isinstance(message, msg.ExecuteDone):
            exchange.on_execute_done(message)
        elif isinstance(message, msg.Log):
            self._on_log(message)
        elif isinstance(message, msg.Release):
            exchange.free_p2s(message.handles)
        elif (feature := self._stub.services.handlers.frame_handler(kind)) is not None:
            feature(self._stub, message)
        else:
            waiter = self._waiters.get(kind)
            if waiter is not None and not waiter.done():
                waiter.set_result(message)
            else:
                self._unexpected(kind)

    def _unexpected(self, kind: type) -> None:
        log.warning("unexpected %s from stub '%s'", kind.__name__, self._stub.instance_name)

    def _on_log(self, message: msg.Log) -> None:
        """A record from the stub, logged once with the model's own file:line."""
        level = _LOG_LEVELS.get(message.level, logging.INFO)
        if not log.isEnabledFor(level):
            return
        record = log.makeRecord(log.name, level, message.filename, message.lineno,
                                "[%s] %s", (self._stub.instance_name, message.message), None)
        log.handle(record)

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
