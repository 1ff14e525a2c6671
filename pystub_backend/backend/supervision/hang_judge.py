"""Telling a frozen stub from a busy one and from a starved one, before killing it as hung.

A stale heartbeat alone is no proof: the heartbeat thread needs the GIL and a CPU. A model in a
long C call that holds the GIL stops the beat while it works, and on a loaded machine a stub can
wait seconds for a CPU. So once the heartbeat is late, each check (every `watch_health` tick)
looks at the stub's process too, and counts as a sign of life:

    a heartbeat                         the stub's own word
    CPU time that grew since the last check      busy: running, perhaps holding the GIL
    a thread waiting for a CPU (state R)         starved: it will run when the machine lets it
    the supervisor's own lateness       a tick that fired late means this process was starved
                                        too: that time is not held against the stub

The stub is hung when no sign of life came for the heartbeat timeout: a stopped process
(SIGSTOP, state T: never busy, never starved, and the supervisor's lateness is no excuse) or a
deadlocked one (every thread asleep, no CPU time) is killed within the heartbeat timeout plus
one check interval after its last sign of life.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import psutil

__all__ = ["ProcessProgress", "HangJudge", "read_progress"]


@dataclass(frozen=True)
class ProcessProgress:
    """A process's CPU time so far (user + system, all threads) and its threads' states (one
    letter each, as /proc shows them: R running or runnable, S/D asleep, T/t stopped, Z zombie)."""

    cpu_seconds: float
    thread_states: str

    @property
    def stopped(self) -> bool:
        return bool(self.thread_states) and all(state in "Tt" for state in self.thread_states)

    @property
    def runnable(self) -> bool:
        return "R" in self.thread_states


def read_progress(pid: int) -> ProcessProgress | None:
    """The process's progress, None when it is gone."""
    try:
        times = psutil.Process(pid).cpu_times()
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat", "rb") as file:
                    states.append(file.read().rpartition(b")")[2].split()[0].decode())
            except (OSError, IndexError):
                continue  # the thread ended meanwhile
    except (psutil.Error, OSError):
        return None
    return ProcessProgress(times.user + times.system, "".join(states))


class HangJudge:
    """One stub incarnation's hang verdicts. `limit`: the heartbeat timeout; `probe` reads the
    stub's progress (read_progress, or a fake in tests)."""

    def __init__(self, limit: float, probe: Callable[[], ProcessProgress | None]) -> None:
        self._limit = limit
        self._probe = probe
        self._last_sign: float | None = None  # monotonic time of the last sign of life
        self._cpu: float | None = None  # CPU seconds at the previous look, while the heartbeat is late

    def judge(self, now: float, heartbeat_age: float, lateness: float = 0.0) -> str | None:
        """Why the stub is hung, or None. `lateness`: how much later than asked this check ran."""
        beat = now - heartbeat_age
        if self._last_sign is None or beat > self._last_sign:
            self._last_sign = beat
        if heartbeat_age <= self._limit / 2:  # on time: nothing to look at
            self._cpu = None
            return None
        progress = self._probe()
        if progress is None:
            return None  # gone: its death is the channel's to report
        if not progress.stopped:
            busy = self._cpu is not None and progress.cpu_seconds > self._cpu
            if busy or progress.runnable:
                self._last_sign = now
            else:  # the time this process was not running is not held against the stub
                self._last_sign = min(now, self._last_sign + lateness)
        self._cpu = progress.cpu_seconds
        silent = now - self._last_sign
        if silent <= self._limit:
            return None
        how = "stopped" if progress.stopped else "asleep, using no CPU"
        return f"no heartbeat for {heartbeat_age:.1f} s and no sign of life for {silent:.1f} s ({how}; limit " \
               f"{self._limit:g} s)"
