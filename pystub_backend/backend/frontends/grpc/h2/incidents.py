"""The log of misbehaving clients: one line per connection at most, and few of those.

A client that breaks the protocol (a bad client magic, junk bytes, too many header fields), floods
the server or pings too often costs one line, without a traceback, naming its peer and why its
connection was closed; a failed `accept` (the descriptor table full) costs one line per pause.
Of all these, at most `_LINES` are written in any `_WINDOW` seconds; the rest are counted, and
one summary says how many there were: "gRPC: 4,996 more in the last 10 s (bad client magic:
4,996)". Five hundred junk connections thus write six lines, not eleven thousand.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

__all__ = ["IncidentLog"]

_WINDOW = 10.0
_LINES = 5


class IncidentLog:
    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._window_start = -_WINDOW
        self._written = 0
        self._suppressed: collections.Counter[str] = collections.Counter()
        self._summary: asyncio.TimerHandle | None = None

    def report(self, kind: str, text: str) -> None:
        """One incident of `kind` (a few words: the summary counts by it), logged as `text`."""
        now = time.monotonic()
        if now - self._window_start >= _WINDOW:
            self._summarize()
            self._window_start, self._written = now, 0
        if self._written < _LINES:
            self._written += 1
            self._log.warning("%s", text)
            return
        self._suppressed[kind] += 1
        if self._summary is None:
            delay = self._window_start + _WINDOW - now
            self._summary = asyncio.get_running_loop().call_later(max(0.0, delay), self._summarize)

    def _summarize(self) -> None:
        if self._summary is not None:
            self._summary.cancel()
            self._summary = None
        if not self._suppressed:
            return
        kinds = ", ".join(f"{kind}: {count:,}" for kind, count in self._suppressed.most_common())
        self._log.warning("gRPC: %s more in the last %g s (%s)", f"{sum(self._suppressed.values()):,}",
                          _WINDOW, kinds)
        self._suppressed.clear()

    def close(self) -> None:
        """Write the summary now (the server stops)."""
        self._summarize()
