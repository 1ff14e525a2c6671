"""SIGINT / SIGTERM / SIGHUP only record that the run should stop; the run checks between steps.

Raising from a signal handler is not safe here: the handler may run inside a grpc callback or a
finalizer, where the exception is printed and swallowed, and the servers would outlive the run.
A second signal raises KeyboardInterrupt at once (the `finally` blocks still stop the servers).
"""

from __future__ import annotations

import signal

_received: list[int] = []


class StopRequested(Exception):
    """The run was asked to stop by a signal."""


def _record(signum: int, frame: object) -> None:
    _received.append(signum)
    if len(_received) > 1:
        raise KeyboardInterrupt


def install() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _record)


def requested() -> bool:
    return bool(_received)


def check() -> None:
    """Raises StopRequested once a signal arrived."""
    if _received:
        raise StopRequested(f"stopped by signal {signal.Signals(_received[0]).name}")


def signal_number() -> int:
    """The first signal received, 0 when none."""
    return _received[0] if _received else 0
