"""Frames that carry descriptors on a SOCK_SEQPACKET socket of their own (the shared-weights fork
socket: ipc/messages/forks.py). The channel carries only arena segments; these carry a forked
instance's channel end, control block, stdout and stderr one way and its pidfd the other.

Every descriptor is accounted for: the sender closes its copies once `send_with_fds` returned
(the kernel holds them in flight), the receiver owns what `receive_with_fds` returns and closes
what a malformed frame brought. Received descriptors are close-on-exec (MSG_CMSG_CLOEXEC).
"""

from __future__ import annotations

import array
import os
import socket

__all__ = ["send_with_fds", "receive_with_fds", "close_all", "MAX_FRAME_FDS"]

MAX_FRAME_FDS = 8  # the most one frame of the fork socket carries (a Fork carries 4)
_FRAME_BYTES = 64 * 1024
_ANCILLARY = socket.CMSG_SPACE(MAX_FRAME_FDS * array.array("i").itemsize)


def send_with_fds(sock: socket.socket, frame: bytes, fds: list[int]) -> None:
    """Send one frame with `fds` (SCM_RIGHTS); the caller still owns and closes its copies.
    Raises BlockingIOError (queue full, nothing sent) and OSError (peer gone)."""
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([frame], ancillary)


def receive_with_fds(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One frame and the descriptors that came with it (b"" at EOF). Raises BlockingIOError when
    nothing is queued, OSError."""
    frame, ancillary, flags, _ = sock.recvmsg(_FRAME_BYTES, _ANCILLARY, socket.MSG_CMSG_CLOEXEC)
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    received = list(fds)
    if flags & socket.MSG_CTRUNC:  # more than a frame of ours carries: not from our peer
        close_all(received)
        raise OSError("a frame on the fork socket carried more descriptors than any message has")
    return frame, received


def close_all(fds: list[int]) -> None:
    """Close every descriptor in `fds` (those already closed are skipped)."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
