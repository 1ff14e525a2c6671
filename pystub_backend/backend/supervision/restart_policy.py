"""The restart back-off, written once: stub instances (instance.py) and the frontend worker pool
(worker_pool/pool.py) both wait by it before starting a process again.

    failure ─▶ record_failure(now) ─▶ exhausted? (more than `max_restarts` within the window)
                                    └▶ delay(): `restart_backoff_seconds` doubling per failure in
                                       the window, capped at `restart_backoff_max_seconds`

Failures older than `restart_window_seconds` are forgotten, so a process that ran well for a
window starts again with the first back-off.
"""

from __future__ import annotations

import collections

from pystub_backend.backend.supervision.settings import StubSettings

__all__ = ["RestartPolicy"]


class RestartPolicy:
    """Back-off doubling from `restart_backoff_seconds` (capped); more than `max_restarts` failures
    within `restart_window_seconds` means the instance stays down."""

    def __init__(self, settings: StubSettings) -> None:
        self._settings = settings
        self._failures: collections.deque[float] = collections.deque()

    def record_failure(self, now: float) -> None:
        self._failures.append(now)
        while self._failures and now - self._failures[0] > self._settings.restart_window_seconds:
            self._failures.popleft()

    @property
    def exhausted(self) -> bool:
        return len(self._failures) > self._settings.max_restarts

    def summary(self) -> str:
        return f"{len(self._failures)} failures within {self._settings.restart_window_seconds:g} s"

    def delay(self) -> float:
        """Seconds to wait before the next spawn."""
        return min(self._settings.restart_backoff_max_seconds,
                   self._settings.restart_backoff_seconds * 2 ** max(0, len(self._failures) - 1))

    def reset(self) -> None:
        self._failures.clear()
