"""Read deadlines of an HTTP connection: a slow or silent client cannot hold a connection open.

A client sending one header line, or one body byte, every 9 s would otherwise keep its connection,
a file descriptor and a parser forever. One `ReadDeadlines` per connection, driven by the
connection's protocol (connection.py for the inference port, timeouts.py for aiohttp's):

    connect ──► HEAD: the whole request head must arrive within `header_seconds` of the
                │     connection (or of a kept-alive request's first byte); an idle
                │     connection counts as a head that never came
                ▼ head parsed, body expected
                BODY: the body must arrive within `body_seconds`, extended by one second per
                │     MIN_BODY_RATE bytes received (a large upload on a slow link finishes;
                │     one byte every 9 s does not)
                ▼ body complete
                IDLE: the handler runs, then the connection waits for the next request: no
                      deadline, or the keep-alive one the protocol gives
    deadline passes ──► `expired(phase)`: the protocol closes the connection without a response
                        (as Triton's server does)

The timer is lazy: one armed no later than the new deadline stays (it finds the deadline moved when
it fires, and re-arms), so the requests of a kept-alive connection share one instead of each making
and cancelling a timer; a phase change costs a clock read.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["DEFAULT_BODY_SECONDS", "DEFAULT_HEADER_SECONDS", "MIN_BODY_RATE", "Phase", "ReadDeadlines", "ReadTimeouts"]

DEFAULT_HEADER_SECONDS = 30.0  # Apache's mod_reqtimeout allows 20-40 s for the head
DEFAULT_BODY_SECONDS = 60.0
MIN_BODY_RATE = 64 * 1024  # bytes per second that extend the body deadline by one second


@dataclass(frozen=True)
class ReadTimeouts:
    """`--http-header-timeout-secs` and `--http-body-timeout-secs`; 0 turns one off."""

    header_seconds: float = DEFAULT_HEADER_SECONDS
    body_seconds: float = DEFAULT_BODY_SECONDS


class Phase(enum.Enum):
    HEAD = "head"
    BODY = "body"
    IDLE = "idle"


class ReadDeadlines:
    """The deadline of a connection's current phase; `expired(phase)` when it passes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeouts: ReadTimeouts,
                 expired: Callable[[Phase], None]) -> None:
        self._loop = loop
        self._timeouts = timeouts
        self._expired_callback = expired
        self.phase = Phase.IDLE
        self._deadline: float | None = None  # the current phase's (before a body's extension)
        self.body_received = 0
        self._timer: asyncio.TimerHandle | None = None

    def head(self) -> None:
        self._enter(Phase.HEAD, self._timeouts.header_seconds)

    def body(self) -> None:
        self.body_received = 0
        self._enter(Phase.BODY, self._timeouts.body_seconds)

    def idle(self, keep_alive_seconds: float = 0.0) -> None:
        self._enter(Phase.IDLE, keep_alive_seconds)

    def cancel(self) -> None:
        self.phase, self._deadline = Phase.IDLE, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _enter(self, phase: Phase, seconds: float) -> None:
        self.phase = phase
        if seconds <= 0:
            self._deadline = None
            return
        self._deadline = self._loop.time() + seconds
        if self._timer is None or self._timer.when() > self._deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(self._deadline, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if self._deadline is None:  # no deadline now: the next phase's arms a timer again
            return
        allowed = self._deadline
        if self.phase is Phase.BODY:  # a body arriving fast enough earns more time
            allowed += self.body_received / MIN_BODY_RATE
        if self._loop.time() < allowed:
            self._timer = self._loop.call_at(allowed, self._fire)
            return
        phase = self.phase
        self.phase, self._deadline = Phase.IDLE, None
        self._expired_callback(phase)
