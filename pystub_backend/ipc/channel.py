"""The message queues between backend and stub: a SOCK_SEQPACKET socket pair.

The alternatives were kernel POSIX message queues and a shm ring buffer with semaphores
(docs/design.md#the-channel-a-socket-pair-not-message-queues). A SEQPACKET Unix socket pair does the job of both
directions' queues with none of their costs:
- no per-user caps: mqueues allow ~10 queues of 8 KiB x 10 messages under default limits, far
  short of 64 stubs; a socket pair is limited only by the file-descriptor table;
- frames are atomic: one send is one message, never torn, never merged, even with several
  sending threads;
- a full queue blocks the sender (or, non-blocking, says EAGAIN), so we wait with a deadline;
- the peer's death is seen at once: its end closes and the reader gets EOF;
- nothing is named, so nothing can leak in /dev/shm, and asyncio can watch the fd directly.

Frames are at most MAX_FRAME bytes; anything large goes in an arena, never in a frame.

The channel also carries the arenas' segments (ipc/arena.py), which have no name: each end is
bound to the arena it writes (`SegmentSource`) and the arena it reads (`SegmentSink`). Every frame
sent takes along, as SCM_RIGHTS, the descriptors of the segments its writer created since the
previous frame; the receiver maps them before it hands the frame on. Taking and sending happen
under one lock (the stub's threads) or in one synchronous call (the backend's loop), so a
segment's descriptor arrives no later than the first frame that names it. Received descriptors
are close-on-exec (MSG_CMSG_CLOEXEC): a process the model starts inherits none.
"""

from __future__ import annotations

import array
import asyncio
import errno
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["MAX_FRAME", "MAX_FDS", "ChannelClosedError", "ChannelTimeoutError", "FrameTooLargeError",
           "DescriptorsLostError", "SegmentSource", "SegmentSink", "make_pair", "BlockingChannel", "AsyncChannel"]

_log = logging.getLogger("pystub.ipc")

MAX_FRAME = 128 * 1024
_BUFFER_BYTES = 1 << 20  # asked for; the kernel caps it at net.core.{w,r}mem_max
MAX_FDS = 253  # SCM_MAX_FD: the most descriptors one frame can carry
_ANCILLARY = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
# As plain ints: the socket module's are IntFlag members, whose `&` runs enum code on every frame.
_CLOEXEC, _CTRUNC = int(socket.MSG_CMSG_CLOEXEC), int(socket.MSG_CTRUNC)


class SegmentSource(Protocol):
    """The arena this end writes: descriptors of its new segments, to send and then close.
    `unsent_segments` is non-empty while there are any (read for every frame: an attribute)."""

    unsent_segments: list[Any]

    def take_new_fds(self) -> list[int]: ...


class SegmentSink(Protocol):
    """The arena this end reads: maps (and closes) descriptors that arrived, in order."""

    def add_fds(self, fds: list[int]) -> None: ...


class ChannelClosedError(ConnectionError):
    """The peer closed its end: it exited or died."""


class DescriptorsLostError(ChannelClosedError):
    """Segment descriptors sent with a frame did not all arrive: the channel cannot go on."""


class ChannelTimeoutError(TimeoutError):
    """A send or receive did not complete before its deadline; the message names what waited."""


class FrameTooLargeError(ValueError):
    pass


def make_pair() -> tuple[socket.socket, socket.socket]:
    """(backend end, stub end); the stub end is inheritable for passing to the child."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for sock in (parent, child):
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, option, _BUFFER_BYTES)
            except OSError:
                pass
    child.set_inheritable(True)
    return parent, child


def _check_size(frame: bytes) -> None:
    if len(frame) > MAX_FRAME:
        raise FrameTooLargeError(f"frame of {len(frame)} bytes exceeds the {MAX_FRAME}-byte limit")


class _Segments:
    """One end's share of the segment handover: descriptors waiting to go out with a frame (kept
    across a send that found the queue full), and where arriving ones go."""

    def __init__(self) -> None:
        self.source: SegmentSource | None = None
        self.sink: SegmentSink | None = None
        self._outgoing: list[int] = []
        # One receive buffer for the channel's life: recvmsg(MAX_FRAME) would allocate (and fault
        # in) a fresh 128 KiB object per frame, ~10x the cost of receiving into this and copying
        # out the frame's few bytes.
        self._buffer = memoryview(bytearray(MAX_FRAME))

    def send(self, sock: socket.socket, frame: bytes) -> None:
        """sendmsg `frame` with the descriptors due (at most MAX_FDS; the rest go with the next
        frame); closes them once sent. Raises what sendmsg raises, keeping them for a retry."""
        source = self.source
        if source is not None and source.unsent_segments:
            self._outgoing.extend(source.take_new_fds())
        if not self._outgoing:
            sock.send(frame)
            return
        batch = self._outgoing[:MAX_FDS]
        sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", batch))])
        del self._outgoing[:len(batch)]
        for fd in batch:
            os.close(fd)

    def receive(self, sock: socket.socket) -> bytes:
        """recvmsg one frame; hands the descriptors that came with it to the sink (or closes
        them) before returning. Raises what recvmsg raises."""
        # The buffer holds MAX_FDS descriptors, the most a sender puts on one frame, so none is
        # truncated away (MSG_CTRUNC) by a well-behaved peer; a frame naming a segment that never
        # arrived fails in the sink with an error that says so.
        size, ancillary, flags, _ = sock.recvmsg_into([self._buffer], _ANCILLARY, _CLOEXEC)
        frame = self._buffer[:size].tobytes()
        fds = array.array("i")
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        if flags & _CTRUNC:
            # Descriptors were dropped (this process is at its descriptor limit, or the peer sent
            # more than MAX_FDS): every later segment would take a wrong index and map the wrong
            # memory, so the channel ends here.
            for fd in fds:
                os.close(fd)
            raise DescriptorsLostError(f"a frame's descriptors were truncated (MSG_CTRUNC; {len(fds)} of them "
                                       f"arrived): out of file descriptors? The channel is closed")
        if fds:
            if self.sink is not None:
                self.sink.add_fds(list(fds))
            else:
                for fd in fds:
                    os.close(fd)
        return frame

    def close(self) -> None:
        for fd in self._outgoing:
            os.close(fd)
        self._outgoing.clear()


_AT_ONCE = 20e-6  # s: a select that returned within this found its frame waiting


class BlockingChannel:
    """The stub's end: blocking calls with deadlines, usable from several threads."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._sock.setblocking(False)
        self._send_lock = threading.Lock()
        self._segments = _Segments()
        self._waited = False  # the last recv found no frame waiting

    def carry_segments(self, source: SegmentSource, sink: SegmentSink) -> None:
        """Send `source`'s new segments with the frames, map arriving ones into `sink`."""
        self._segments.source, self._segments.sink = source, sink

    def fileno(self) -> int:
        return self._sock.fileno()

    def send(self, frame: bytes, timeout: float, what: str = "frame") -> None:
        """Send one frame, waiting at most `timeout` s for room in the queue.

        Raises ChannelTimeoutError naming `what`, ChannelClosedError, FrameTooLargeError.
        """
        if len(frame) > MAX_FRAME:
            _check_size(frame)
        with self._send_lock:
            deadline = 0.0  # set once the queue is found full (the usual send never reads the clock)
            while True:
                try:
                    self._segments.send(self._sock, frame)
                    return
                except BlockingIOError:
                    pass
                except (BrokenPipeError, ConnectionResetError) as exc:
                    raise ChannelClosedError(f"peer closed the channel while sending {what}") from exc
                now = time.monotonic()
                deadline = deadline or now + timeout
                if now >= deadline:
                    raise ChannelTimeoutError(f"timed out after {timeout:.1f} s waiting to send {what}: "
                                              f"the peer is not reading its queue")
                select.select([], [self._sock], [], min(deadline - now, 0.5))

    def recv(self, timeout: float) -> bytes | None:
        """One frame, or None when none arrived within `timeout` s. Raises ChannelClosedError."""
        try:
            frame = self._receive(timeout)
        except BlockingIOError:
            return None
        except ConnectionResetError as exc:
            raise ChannelClosedError("peer reset the channel") from exc
        if frame is not None and not frame:
            raise ChannelClosedError("peer closed the channel")
        return frame

    def _receive(self, timeout: float) -> bytes | None:
        # Under load a frame is usually waiting already and a read needs no select. When the last
        # call had to wait, this one likely will too, and a read first would only fail (a system
        # call and an exception per frame at concurrency 1): it selects first, and a select that
        # returns at once found a frame waiting, so the next call reads first again.
        if not self._waited:
            try:
                return self._segments.receive(self._sock)
            except BlockingIOError:
                pass
        started = time.monotonic()
        if not select.select([self._sock], [], [], timeout)[0]:
            self._waited = True
            return None
        self._waited = time.monotonic() - started > _AT_ONCE
        return self._segments.receive(self._sock)

    def close(self) -> None:
        self._segments.close()
        self._sock.close()


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class AsyncChannel:
    """The backend's end, driven by the event loop: frames are delivered to `on_frame` as they
    arrive; `on_closed` runs once when the peer's end closes."""

    def __init__(self, sock: socket.socket, on_frame: Callable[[bytes], None],
                 on_closed: Callable[[], None]) -> None:
        self._sock = sock
        self._sock.setblocking(False)
        self._on_frame = on_frame
        self._on_closed = on_closed
        self._loop = asyncio.get_running_loop()
        self.closed = False  # an attribute: asked for every frame sent
        self._segments = _Segments()
        self._loop.add_reader(sock.fileno(), self._readable)

    def carry_segments(self, source: SegmentSource, sink: SegmentSink) -> None:
        """Send `source`'s new segments with the frames, map arriving ones into `sink`."""
        self._segments.source, self._segments.sink = source, sink

    def _readable(self) -> None:
        while not self.closed:
            try:
                frame = self._segments.receive(self._sock)
            except BlockingIOError:
                return
            except DescriptorsLostError as exc:
                _log.error("%s", exc)
                frame = b""
            except OSError:
                frame = b""
            if not frame:
                self._mark_closed()
                return
            self._on_frame(frame)

    def _mark_closed(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self._sock.fileno())
        self._on_closed()

    def try_send(self, frame: bytes) -> bool:
        """Send now if the queue has room; False if it is full. Raises ChannelClosedError."""
        if len(frame) > MAX_FRAME:
            _check_size(frame)
        if self.closed:
            raise ChannelClosedError("channel is closed")
        try:
            self._segments.send(self._sock, frame)
            return True
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                raise ChannelClosedError(f"peer closed the channel: {exc}") from exc
            raise

    async def send(self, frame: bytes, timeout: float, what: str = "frame") -> None:
        """Send one frame, waiting at most `timeout` s for room. Raises ChannelTimeoutError naming
        `what`, ChannelClosedError."""
        if self.try_send(frame):
            return
        deadline = self._loop.time() + timeout
        while True:
            writable = self._loop.create_future()
            fd = self._sock.fileno()
            self._loop.add_writer(fd, _resolve, writable)
            try:
                await asyncio.wait_for(writable, max(0.0, deadline - self._loop.time()))
            except asyncio.TimeoutError:
                raise ChannelTimeoutError(f"timed out after {timeout:.1f} s waiting to send {what}: "
                                          f"the stub is not reading its queue") from None
            finally:
                self._loop.remove_writer(fd)
            if self.try_send(frame):
                return

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._loop.remove_reader(self._sock.fileno())
        self._segments.close()
        self._sock.close()
