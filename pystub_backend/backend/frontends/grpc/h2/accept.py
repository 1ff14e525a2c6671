"""Accepting the h2 stack's connections on one listening socket.

asyncio's own accept loop (`loop.create_server`) is not used: when `accept` fails for want of
descriptors (EMFILE, ENFILE) or memory, Python 3.11's loop logs the error with a traceback and
schedules a retry for every one of the `backlog` attempts of that wakeup, and each retry does the
same: 271,876 log lines in 12 s with the descriptor table full. Here a failed accept pauses
accepting for `_PAUSE_SECONDS` (the kernel keeps the waiting clients in its backlog) with one line
in the incident log, and accepting resumes after it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from collections.abc import Callable

from pystub_backend.backend.frontends.grpc.h2.incidents import IncidentLog

__all__ = ["Acceptor"]

log = logging.getLogger("pystub.grpc")
_PAUSE_SECONDS = 1.0
_ACCEPTS_PER_WAKEUP = 256  # a burst of clients is taken at once, and then the loop serves the others
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class Acceptor:
    def __init__(self, sock: socket.socket, tls: ssl.SSLContext | None, handshake_timeout: float | None,
                 protocol: Callable[[], asyncio.Protocol], incidents: IncidentLog) -> None:
        self._sock, self._tls, self._handshake_timeout = sock, tls, handshake_timeout
        self._protocol, self._incidents = protocol, incidents
        self._loop: asyncio.AbstractEventLoop | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._handshakes: set[asyncio.Task[None]] = set()  # connections being set up (TLS: handshaking)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._sock.setblocking(False)  # the accept loop below must stop when none is waiting
        self._loop.add_reader(self._sock.fileno(), self._accept)

    def stop(self) -> None:
        """Accept nothing more; connections still in their TLS handshake are dropped."""
        if self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        for task in list(self._handshakes):
            task.cancel()

    def _accept(self) -> None:
        assert self._loop is not None
        for _ in range(_ACCEPTS_PER_WAKEUP):
            try:
                connection, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                self._pause(exc)
                return
            connection.setblocking(False)
            task = self._loop.create_task(self._connect(connection))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _connect(self, connection: socket.socket) -> None:
        assert self._loop is not None
        try:
            await self._loop.connect_accepted_socket(
                self._protocol, connection, ssl=self._tls,
                ssl_handshake_timeout=self._handshake_timeout if self._tls is not None else None)
        except (OSError, ssl.SSLError, asyncio.TimeoutError) as exc:  # the client's handshake failed
            log.debug("gRPC connection not set up: %s", exc)
            connection.close()

    def _pause(self, exc: OSError) -> None:
        """`accept` failed: for want of resources, wait a while; anything else, likewise (the loop
        must not spin on a socket that keeps failing)."""
        assert self._loop is not None
        self._loop.remove_reader(self._sock.fileno())
        why = "descriptors or memory exhausted" if exc.errno in _OUT_OF_RESOURCES else "accept failed"
        self._incidents.report(why, f"gRPC: accept failed ({exc.strerror or exc}): "
                                    f"not accepting for {_PAUSE_SECONDS:g} s")
        self._retry = self._loop.call_later(_PAUSE_SECONDS, self._resume)

    def _resume(self) -> None:
        self._retry = None
        assert self._loop is not None
        self._loop.add_reader(self._sock.fileno(), self._accept)
