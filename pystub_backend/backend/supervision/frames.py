"""The frame link to one stub: the one place that sends to a stub with a deadline, and the
dispatcher of the frames the stub sends back.

    send(message, timeout)   await room in the stub's queue, at most `timeout` s (default: the stub
                             timeout); raises ChannelTimeoutError naming the message and the stub,
                             ChannelClosedError when the stub is gone
    try_send(message)        send now if there is room, else False (nothing sent); never waits
    post(message, on_failed) never blocks: sent at once when there is room, else from a task bounded
                             by the stub timeout, in order behind earlier posted frames;
                             `on_failed(error)` when it could not go (EXECUTE frames)
    send_soon(message)       `post` whose failures are logged (replies and notices nobody awaits)
    flush()                  wait until every `send_soon` frame went out (or was given up)
    request_reply(...)       send and wait for the reply of a given class (INIT, IS_READY, ...)
    await_reply(...)         wait for such a reply without sending (one wait, shared with the above)

A frame over the channel's limit (a request with megabytes of metadata) is written into the p2s
arena and sent as SPILLED (pystub_backend.ipc.spill); the stub RELEASEs it once read. A SPILLED
frame from the stub is read from s2p, released at once, and dispatched like any other frame.

Incoming frames go to whoever routed their kind here (the request exchange takes RESPONSE,
EXECUTE_DONE and RELEASE), LOG to the backend log, feature frames to the handler `features` names
for their kind, replies to their waiter. The link is built from the channel's socket and the two
arenas; it knows nothing of the process behind them.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar, cast

from pystub_backend.backend.supervision.errors import StubStartError
from pystub_backend.ipc import spill
from pystub_backend.ipc.arena import ArenaFullError, ArenaReader, ArenaWriter
from pystub_backend.ipc.channel import MAX_FRAME, AsyncChannel, ChannelClosedError, ChannelTimeoutError
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.messages.to_backend import is_to_backend
from pystub_backend.ipc.wire import kind_of, pack

__all__ = ["FrameLink", "FeatureLookup"]

_Reply = TypeVar("_Reply")
# The handler of a feature's frame kind, already bound to the stub it came from; None: no feature has it.
FeatureLookup = Callable[[type], "Callable[[Any], None] | None"]

log = logging.getLogger("pystub.stub")
_KINDS: dict[type, int] = {}  # message class -> its kind number (ipc.wire)
_LOG_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}


def _no_feature(_kind: type) -> None:
    return None


class FrameLink:
    def __init__(self, sock: socket.socket, name: str, timeout: float, p2s: ArenaWriter, s2p: ArenaReader,
                 describe_death: Callable[[str], str], on_closed: Callable[[], None]) -> None:
        """`describe_death(what)` words a failed wait for `what` ("stub ... was killed by SIGKILL
        while waiting for initialize"); `on_closed` runs once, when the stub's end closes."""
        self.name = name
        self._timeout = timeout
        self._p2s = p2s
        self._s2p = s2p
        self._describe_death = describe_death
        self._routes: dict[type, Callable[[Any], None]] = {msg.Log: self._on_log}
        self._features: FeatureLookup = _no_feature
        self._waiters: dict[type, asyncio.Future[object]] = {}
        self._last_soon: asyncio.Task[None] | None = None
        self._soon_tasks: set[asyncio.Task[None]] = set()
        self.channel = AsyncChannel(sock, self._on_frame, on_closed)
        # p2s segments go to the stub with the frames; s2p segments arrive with the stub's frames.
        self.channel.carry_segments(p2s, s2p)

    def route(self, kind: type, handler: Callable[[Any], None]) -> None:
        """Frames of `kind` go to `handler` (the request exchange's kinds)."""
        self._routes[kind] = handler

    def route_features(self, features: FeatureLookup) -> None:
        """Kinds nobody routed go to the feature handler `features(kind)` names."""
        self._features = features

    @property
    def closed(self) -> bool:
        return self.channel.closed

    # -- sending -----------------------------------------------------------------------------------
    def _what(self, message: NamedTuple) -> str:
        return f"{type(message).__name__} to stub '{self.name}'"

    def _frame(self, message: NamedTuple) -> tuple[bytes, list[int] | None]:
        """The frame for `message`, and the p2s handle it was spilled into when it is over the
        limit (else None). Raises ArenaFullError when p2s cannot hold it, and what `encode` raises
        for a value the wire cannot carry."""
        # wire.encode and spill.fits, written out: every frame to the stub comes this way
        kind = _KINDS.get(type(message))
        if kind is None:
            kind = _KINDS[type(message)] = kind_of(type(message))
        frame = pack((kind, *message))
        if len(frame) <= MAX_FRAME:
            return frame, None
        return spill.spill(frame, self._p2s)

    async def send(self, message: NamedTuple, timeout: float | None = None) -> None:
        """Send `message`, waiting at most `timeout` s (default: the stub timeout) for room.

        Raises ChannelTimeoutError (naming the message and the stub), ChannelClosedError,
        ArenaFullError (a frame over the limit that p2s cannot hold), and TypeError, ValueError or
        OverflowError for a value the wire cannot carry."""
        frame, spilled = self._frame(message)
        try:
            await self.channel.send(frame, self._timeout if timeout is None else timeout, self._what(message))
        except (ChannelClosedError, ChannelTimeoutError):
            self._unsent(spilled)
            raise

    def try_send(self, message: NamedTuple) -> bool:
        """Send `message` now if the stub's queue has room; False (nothing sent) if it is full.
        Raises as `send` does, but never ChannelTimeoutError."""
        frame, spilled = self._frame(message)
        try:
            if self.channel.try_send(frame):
                return True
        except ChannelClosedError:
            self._unsent(spilled)
            raise
        self._unsent(spilled)
        return False

    def post(self, message: NamedTuple, on_failed: Callable[[Exception], None]) -> None:
        """Send `message` in order with earlier posted (and `send_soon`) frames, never blocking:
        at once when there is room, else from a task bounded by the stub timeout, which calls
        `on_failed(error)` if the frame could not go (the channel stayed full or closed). Raises
        what encoding raises (ArenaFullError, TypeError, ValueError, OverflowError: nothing
        sent) and ChannelClosedError."""
        channel = self.channel
        if channel.closed:
            raise ChannelClosedError(f"the channel to stub '{self.name}' is closed")
        frame, spilled = self._frame(message)
        previous = self._last_soon
        if previous is None or previous.done():
            try:
                if channel.try_send(frame):
                    return
            except ChannelClosedError:
                self._unsent(spilled)
                raise
            previous = None
        task = asyncio.ensure_future(self._send_later(frame, spilled, self._what(message), previous, on_failed))
        self._last_soon = task
        self._soon_tasks.add(task)
        task.add_done_callback(self._soon_tasks.discard)

    def send_soon(self, message: NamedTuple) -> None:
        """`post` for replies and notices nobody awaits: never raises; failures are logged."""
        try:
            self.post(message, lambda exc: log.warning("could not send %s: %s", self._what(message), exc))
        except ChannelClosedError:
            return
        except (ArenaFullError, TypeError, ValueError, OverflowError) as exc:
            log.warning("could not send %s: %s", self._what(message), exc)

    async def _send_later(self, frame: bytes, spilled: list[int] | None, what: str,
                          previous: asyncio.Task[None] | None, on_failed: Callable[[Exception], None]) -> None:
        if previous is not None:
            await asyncio.wait({previous})  # keep the frames in the order they were sent
        try:
            await self.channel.send(frame, self._timeout, what)
        except (ChannelClosedError, ChannelTimeoutError) as exc:
            self._unsent(spilled)
            on_failed(exc)

    def _unsent(self, spilled: list[int] | None) -> None:
        """A spilled frame that was never sent: free its p2s bytes (the stub cannot release them)."""
        if spilled is not None:
            try:
                self._p2s.free(spilled)
            except (KeyError, IndexError, ValueError):
                log.error("stub '%s': the unsent spilled frame at %s was freed already", self.name, spilled)

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
            raise StubStartError(self._describe_death(what))
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._waiters[reply] = future
        try:
            if message is not None:
                try:
                    await self.send(message)
                except (ChannelClosedError, ChannelTimeoutError, ArenaFullError) as exc:
                    raise StubStartError(f"{self._describe_death(what)} ({exc})") from exc
            try:
                return cast(_Reply, await asyncio.wait_for(future, timeout))
            except asyncio.TimeoutError:
                raise StubStartError(f"timed out after {timeout:.0f} s waiting for {what} from stub "
                                     f"'{self.name}'") from None
        finally:
            if self._waiters.get(reply) is future:
                del self._waiters[reply]

    def fail_waiters(self) -> None:
        """The stub is gone: every reply waiter learns it now."""
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(StubStartError(self._describe_death("a reply")))

    # -- receiving ---------------------------------------------------------------------------------
    def _on_frame(self, frame: bytes) -> None:
        try:
            message = msg.decode(frame)
            if type(message) is msg.Spilled:
                message = spill.unspill(message, self._s2p, self._release_s2p)
        except msg.MessageDecodeError as exc:
            log.error("dropped a corrupt frame from stub '%s': %s", self.name, exc)
            return
        kind = type(message)
        try:
            handler = self._routes.get(kind)
            if handler is not None:
                handler(message)
            elif not is_to_backend(message):  # a kind only the backend sends
                self._unexpected(kind)
            elif (feature := self._features(kind)) is not None:
                feature(message)
            else:
                self._answer(kind, message)
        except Exception as exc:  # noqa: BLE001 - a malformed frame must not end the channel's reader
            log.error("dropped a malformed %s frame from stub '%s': %s: %s", kind.__name__, self.name,
                      type(exc).__name__, exc)

    def _release_s2p(self, handle: list[int]) -> None:
        """A spilled frame from the stub was read: its s2p bytes go back (rare: no batching)."""
        self.send_soon(msg.Release([handle], []))

    def _answer(self, kind: type, message: Any) -> None:
        waiter = self._waiters.get(kind)
        if waiter is not None and not waiter.done():
            waiter.set_result(message)
        else:
            self._unexpected(kind)

    def _unexpected(self, kind: type) -> None:
        log.warning("unexpected %s from stub '%s'", kind.__name__, self.name)

    def _on_log(self, message: msg.Log) -> None:
        """A record from the stub, logged once with the model's own file:line."""
        level = _LOG_LEVELS.get(message.level, logging.INFO)
        if not log.isEnabledFor(level):
            return
        record = log.makeRecord(log.name, level, message.filename, message.lineno,
                                "[%s] %s", (self.name, message.message), None)
        log.handle(record)

    def close(self) -> None:
        self.channel.close()
