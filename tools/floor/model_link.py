"""The parent's end of the floor's socketpair to its model process (model_process.py has the wire).

`submit(tensors, on_answer)` sends one datagram and keeps the callback under the request's id; the
event loop calls `_read` when answers are waiting, and each answer's callback runs there, with no
task or future per request. A send that finds the socket's buffer full waits in a backlog that
the loop drains when the socket is writable again (SOCK_SEQPACKET sends whole datagrams or none).
When the model process exits, every waiting request is answered with that error.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import msgpack
from model_process import MAX_DATAGRAM

# (error or None, outputs as [[name, datatype, shape, data], ...])
OnAnswer = Callable[[str | None, list[list]], None]
MAX_TENSOR_BYTES = 64 << 10  # below MAX_DATAGRAM with the header's room; larger ones are refused


class ModelLink:
    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        self._loop, self._sock = loop, sock
        sock.setblocking(False)
        self._waiting: dict[int, OnAnswer] = {}
        self._next_id = 0
        self._backlog: collections.deque[bytes] = collections.deque()
        self.succeeded = self.failed = 0  # what the statistics endpoint reports
        self.exited = False
        loop.add_reader(sock.fileno(), self._read)

    def submit(self, tensors: list[list], on_answer: OnAnswer) -> None:
        """Send one request; `on_answer` runs on the loop when its answer comes. Raises ValueError
        for a tensor larger than MAX_TENSOR_BYTES (nothing is sent)."""
        if any(len(t[3]) > MAX_TENSOR_BYTES for t in tensors):
            raise ValueError(f"the floor carries tensors of up to {MAX_TENSOR_BYTES} bytes")
        if self.exited:
            on_answer("the model process exited", [])
            return
        self._next_id += 1
        self._waiting[self._next_id] = on_answer
        datagram = msgpack.packb([self._next_id, tensors])
        if not self._backlog:
            try:
                self._sock.send(datagram)
                return
            except BlockingIOError:
                self._loop.add_writer(self._sock.fileno(), self._drain)
            except OSError:  # the model process is gone (EPIPE, ECONNRESET): this request with the rest
                self._model_exited()
                return
        self._backlog.append(datagram)

    def _drain(self) -> None:
        while self._backlog:
            try:
                self._sock.send(self._backlog[0])
            except BlockingIOError:
                return
            except OSError:
                self._model_exited()
                return
            self._backlog.popleft()
        self._loop.remove_writer(self._sock.fileno())

    def _read(self) -> None:
        while True:
            try:
                datagram = self._sock.recv(MAX_DATAGRAM)
            except BlockingIOError:
                return
            except ConnectionError:
                datagram = b""
            if not datagram:
                self._model_exited()
                return
            request_id, error, outputs = msgpack.unpackb(datagram)
            if error is None:
                self.succeeded += 1
            else:
                self.failed += 1
            self._waiting.pop(request_id)(error, outputs)

    def _model_exited(self) -> None:
        self.exited = True
        self._backlog.clear()
        self._loop.remove_reader(self._sock.fileno())
        self._loop.remove_writer(self._sock.fileno())
        waiting, self._waiting = self._waiting, {}
        for on_answer in waiting.values():
            on_answer("the model process exited", [])

    def close(self) -> None:
        """Close the parent's end: the model process reads b"" and returns."""
        if not self.exited:
            self._loop.remove_reader(self._sock.fileno())
            self._loop.remove_writer(self._sock.fileno())
        self._sock.close()


def start(loop: asyncio.AbstractEventLoop) -> tuple[ModelLink, subprocess.Popen]:
    """Spawn the model process on one end of a new socketpair; the link on the other end."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        process = subprocess.Popen([sys.executable, str(Path(__file__).with_name("model_process.py")),
                                    str(child.fileno())], pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL)
    except OSError:
        parent.close()
        raise
    finally:
        child.close()  # the model process has its own copy
    return ModelLink(loop, parent), process
