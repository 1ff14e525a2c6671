"""Telling a frozen stub from a busy one and from a starved one, before killing it as hung.

A stale heartbeat alone is no proof: the heartbeat thread needs the GIL and a CPU. A model in a
long C call that holds the GIL stops the beat while it works, and on a loaded machine a stub can
wait seconds for a CPU. So once the heartbeat is late, each check (every `watch_health` tick)
looks at the stub's threads too (/proc/<pid>/task), and counts as a sign of life:

    a heartbeat                         the stub's own word
    a thread that used BUSY_SHARE of a CPU since the last look     busy: running, perhaps
                                        holding the GIL (threads waiting for the GIL wake every
                                        5 ms and use about 1%: that is no work)
    a thread waiting for a CPU (state R)         starved: it will run when the machine lets it
    the supervisor's own lateness       a tick that fired late means this process was starved
                                        too: that time is not held against the stub

The stub is hung when no sign of life came for the heartbeat timeout: a stopped process
(SIGSTOP, state T: never busy, never starved, and the supervisor's lateness is no excuse) or a
deadlocked one (every thread asleep, no work done: a C call asleep with the GIL held, a lock
never released) is killed within the heartbeat timeout plus one check interval after its last
sign of life.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ProcessProgress", "HangJudge", "read_progress", "BUSY_SHARE"]

BUSY_SHARE = 0.05  # of one CPU, used by one thread between two looks: working, not waiting
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcessProgress:
    """A process's threads: thread id -> (state, CPU seconds so far). States as /proc shows
    them: R running or runnable, S/D asleep, T/t stopped, Z zombie."""

    threads: dict[int, tuple[str, float]]

    @property
    def stopped(self) -> bool:
        return bool(self.threads) and all(state in "Tt" for state, _ in self.threads.values())

    @property
    def runnable(self) -> bool:
        return any(state == "R" for state, _ in self.threads.values())

    def busiest_share(self, earlier: ProcessProgress, seconds: float) -> float:
        """The largest share of a CPU one thread used since `earlier`, `seconds` ago."""
        if seconds <= 0:
            return 0.0
        grown = [cpu - earlier.threads[tid][1] for tid, (_, cpu) in self.threads.items() if tid in earlier.threads]
        return max(grown, default=0.0) / seconds


def _thread_stat(pid: int, tid: str) -> tuple[str, float] | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", "rb") as file:
            fields = file.read().rpartition(b")")[2].split()
    except OSError:
        return None  # the thread ended meanwhile
    return fields[0].decode(), (int(fields[11]) + int(fields[12])) / _TICKS  # state, utime + stime


def read_progress(pid: int) -> ProcessProgress | None:
    """The process's threads now, None when it is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    threads = {int(tid): stat for tid in tids if (stat := _thread_stat(pid, tid)) is not None}
    return ProcessProgress(threads) if threads else None


class HangJudge:
    """One stub incarnation's hang verdicts. `limit`: the heartbeat timeout; `probe` reads the
    stub's progress (read_progress, or a fake in tests)."""

    def __init__(self, limit: float, probe: Callable[[], ProcessProgress | None]) -> None:
        self._limit = limit
        self._probe = probe
        self._last_sign: float | None = None  # monotonic time of the last sign of life
        self._looked: tuple[float, ProcessProgress] | None = None  # the previous look, while the heartbeat is late

    def judge(self, now: float, heartbeat_age: float, lateness: float = 0.0) -> str | None:
        """Why the stub is hung, or None. `lateness`: how much later than asked this check ran."""
        beat = now - heartbeat_age
        if self._last_sign is None or beat > self._last_sign:
            self._last_sign = beat
        if heartbeat_age <= self._limit / 2:  # on time: nothing to look at
            self._looked = None
            return None
        progress = self._probe()
        if progress is None:
            return None  # gone: its death is the channel's to report
        if not progress.stopped:
            busy = self._looked is not None and \
                progress.busiest_share(self._looked[1], now - self._looked[0]) >= BUSY_SHARE
            if busy or progress.runnable:
                self._last_sign = now
            else:  # the time this process was not running is not held against the stub
                self._last_sign = min(now, self._last_sign + lateness)
        self._looked = (now, progress)
        silent = now - self._last_sign
        if silent <= self._limit:
            return None
        how = "stopped" if progress.stopped else "asleep, using no CPU"
        return f"no heartbeat for {heartbeat_age:.1f} s and no sign of life for {silent:.1f} s ({how}; limit " \
               f"{self._limit:g} s)"
