"""The backend's end of a shared-weights template's fork socket (ipc/messages/forks.py): FORK
requests with the child's descriptors out, FORK_DONE with its pidfd and FORKED_EXIT back.

    fork(instance, base, fds, timeout)  send FORK with the four descriptors (the caller closes its
                                        copies after), wait for its FORK_DONE: (pid, pidfd).
                                        Raises ForkFailedError (the template said why),
                                        ChannelTimeoutError, ChannelClosedError
    on_exit(pid, status)                each FORKED_EXIT, as the template reaped a child

A FORK_DONE nobody waits for any more (the fork was given up) has its pidfd closed here; the
child, whose channel's backend end is closed by then, exits by itself.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from collections.abc import Callable

from pystub_backend.ipc.channel import ChannelClosedError, ChannelTimeoutError
from pystub_backend.ipc.descriptors import close_all, receive_with_fds, send_with_fds
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.messages.forks import Fork, ForkDone, ForkedExit

__all__ = ["ForkLink", "ForkFailedError"]

log = logging.getLogger("pystub.stub")
_SEND_RETRY_SECONDS = 0.01


class ForkFailedError(RuntimeError):
    """The template could not fork the instance; the text is its reason."""


class ForkLink:
    def __init__(self, sock: socket.socket, name: str, on_exit: Callable[[int, int], None],
                 on_closed: Callable[[], None]) -> None:
        self.name = name
        self._sock = sock
        self._sock.setblocking(False)
        self._on_exit = on_exit
        self._on_closed = on_closed
        self._tokens = itertools.count(1)
        self._pending: dict[int, asyncio.Future[tuple[ForkDone, int]]] = {}
        self._loop = asyncio.get_running_loop()
        self.closed = False
        self._loop.add_reader(sock.fileno(), self._readable)

    async def fork(self, instance: str, base: str, fds: list[int], timeout: float) -> tuple[int, int]:
        """Ask the template to fork `instance`; returns (pid, pidfd), the pidfd now the caller's."""
        if self.closed:
            raise ChannelClosedError(f"the fork socket of template '{self.name}' is closed")
        token = next(self._tokens)
        future: asyncio.Future[tuple[ForkDone, int]] = self._loop.create_future()
        self._pending[token] = future
        deadline = self._loop.time() + timeout
        what = f"template '{self.name}' to fork instance '{instance}'"
        try:
            await self._send(msg.encode(Fork(token, instance, base)), fds, deadline, what)
            try:
                done, pidfd = await asyncio.wait_for(future, max(0.0, deadline - self._loop.time()))
            except asyncio.TimeoutError:
                raise ChannelTimeoutError(f"timed out after {timeout:.1f} s waiting for the {what}") from None
        finally:
            self._pending.pop(token, None)
        if done.error is not None:
            close_all([pidfd] if pidfd >= 0 else [])
            raise ForkFailedError(f"template '{self.name}' could not fork instance '{instance}': {done.error}")
        if pidfd < 0:
            raise ForkFailedError(f"template '{self.name}' forked instance '{instance}' without its pidfd")
        return done.pid, pidfd

    async def _send(self, frame: bytes, fds: list[int], deadline: float, what: str) -> None:
        while True:
            try:
                send_with_fds(self._sock, frame, fds)
                return
            except BlockingIOError:
                if self._loop.time() >= deadline:
                    raise ChannelTimeoutError(f"timed out waiting for room to ask the {what}") from None
            except OSError as exc:
                raise ChannelClosedError(f"the fork socket of template '{self.name}' is closed: {exc}") from exc
            await asyncio.sleep(_SEND_RETRY_SECONDS)

    def _readable(self) -> None:
        while not self.closed:
            try:
                frame, fds = receive_with_fds(self._sock)
            except BlockingIOError:
                return
            except OSError:
                frame, fds = b"", []
            if not frame:
                self.close()
                self._on_closed()
                return
            self._on_frame(frame, fds)

    def _on_frame(self, frame: bytes, fds: list[int]) -> None:
        try:
            message = msg.decode(frame)
        except msg.MessageDecodeError as exc:
            close_all(fds)
            log.error("dropped a corrupt frame from template '%s': %s", self.name, exc)
            return
        if type(message) is ForkDone:
            pidfd, extra = (fds[0], fds[1:]) if fds else (-1, [])
            close_all(extra)
            future = self._pending.get(message.token)
            if future is None or future.done():
                close_all([pidfd] if pidfd >= 0 else [])  # given up: the child exits on its own
                return
            future.set_result((message, pidfd))
        elif type(message) is ForkedExit:
            close_all(fds)
            self._on_exit(message.pid, message.status)
        else:
            close_all(fds)
            log.warning("unexpected %s on the fork socket of template '%s'", type(message).__name__, self.name)

    def close(self) -> None:
        """Stop reading; every fork still waiting fails with ChannelClosedError."""
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ChannelClosedError(f"template '{self.name}' closed its fork socket"))
