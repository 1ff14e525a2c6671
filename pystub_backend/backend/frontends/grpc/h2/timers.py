"""The clocks of one h2 connection (policy.py says what each limit means): the handshake, idle
and age limits, and the keepalive ping with its ack deadline. Each is a loop timer, armed and
disarmed as the connection's state changes, so an idle connection costs no wakeups."""

from __future__ import annotations

import asyncio
import weakref
from typing import Protocol

from pystub_backend.backend.frontends.grpc.h2.policy import ConnectionPolicy

__all__ = ["ConnectionTimers", "Limited"]

_NO_ERROR = 0


class Limited(Protocol):
    """What the timers do to their connection."""

    def ping(self) -> None: ...

    def goaway(self, code: int = 0, debug: bytes = b"", close: bool = False) -> None: ...

    def close(self) -> None: ...

    def cancel_calls(self) -> None: ...


class ConnectionTimers:
    """The connection is held weakly: a closed connection (and libnghttp2's buffers in it) is freed
    at once by reference counting, not at the garbage collector's next full pass."""

    def __init__(self, connection: Limited, policy: ConnectionPolicy) -> None:
        self._owner = weakref.ref(connection)
        self._policy = policy
        self._handles: dict[str, asyncio.TimerHandle] = {}

    @property
    def _connection(self) -> Limited:
        connection = self._owner()
        if connection is None:  # the timers stop with their connection; a callback cannot outlive it
            raise RuntimeError("the connection of these timers is gone")
        return connection

    def _arm(self, name: str, delay: float | None, action: object) -> None:
        self._disarm(name)
        if delay is not None:
            self._handles[name] = asyncio.get_running_loop().call_later(delay, action)  # type: ignore[arg-type]

    def _disarm(self, name: str) -> None:
        handle = self._handles.pop(name, None)
        if handle is not None:
            handle.cancel()

    def start(self) -> None:
        policy = self._policy
        self._arm("handshake", policy.handshake_timeout, self._handshake_late)
        self._arm("idle", policy.idle, self._idle)
        self._arm("age", policy.age, self._aged)
        self._arm("keepalive", policy.keepalive_time, self._ping)

    def stop(self) -> None:
        for name in list(self._handles):
            self._disarm(name)

    def _handshake_late(self) -> None:
        self._handles.pop("handshake", None)
        self._connection.close()

    def handshake_done(self) -> None:
        self._disarm("handshake")

    def call_started(self) -> None:
        self._disarm("idle")

    def call_ended(self, calls_open: bool) -> None:
        if not calls_open and self._policy.idle is not None:
            self._arm("idle", self._policy.idle, self._idle)

    def _idle(self) -> None:
        self._handles.pop("idle", None)
        self._connection.goaway(_NO_ERROR, b"max_idle")

    def _aged(self) -> None:
        """GOAWAY at the age limit; the calls still open get the grace period, then the connection
        closes (grpc core: max_connection_age_grace_ms, infinite by default)."""
        self._handles.pop("age", None)
        self._connection.goaway(_NO_ERROR, b"max_age")
        self._arm("grace", self._policy.age_grace, self._end)

    def _end(self) -> None:
        self._handles.pop("grace", None)
        self._connection.cancel_calls()
        self._connection.close()

    def _ping(self) -> None:
        self._handles.pop("keepalive", None)
        self._connection.ping()
        self._arm("ack", self._policy.keepalive_timeout, self._end)

    def ping_acknowledged(self) -> None:
        if "ack" in self._handles:
            self._disarm("ack")
            self._arm("keepalive", self._policy.keepalive_time, self._ping)
