"""CPU use and resident memory of processes (the stubs), for `stubctl`'s CPU% and RSS columns.

`psutil.Process.cpu_percent(interval=None)` compares with the previous call on the same object, so
a new object per sample always reads 0.0 (what `stubctl` showed before). `ProcessSampler` keeps one
object per pid across samples and computes the share itself:

    first sample of a pid   CPU time since the process started / wall time since it started
    later samples           CPU time since the previous sample / wall time since then

both as a percentage of one core (a stub busy on two threads shows up to 200). A pid whose process
changed (psutil compares the start time) or is gone starts over; pids not asked for are forgotten.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil

__all__ = ["ProcessSample", "ProcessSampler"]


@dataclass(frozen=True)
class ProcessSample:
    rss_bytes: int
    cpu_percent: float


@dataclass
class _Seen:
    process: psutil.Process
    cpu_seconds: float
    at: float  # time.monotonic() of the sample


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


class ProcessSampler:
    def __init__(self) -> None:
        self._seen: dict[int, _Seen] = {}

    def sample(self, pid: int) -> ProcessSample | None:
        """RSS and CPU% of `pid` now, or None when it cannot be read (gone, not permitted)."""
        seen = self._seen.get(pid)
        try:
            if seen is not None and not seen.process.is_running():  # reused pid: a new process
                seen = None
            process = seen.process if seen is not None else psutil.Process(pid)
            with process.oneshot():
                cpu, rss = _cpu_seconds(process), process.memory_info().rss
                now = time.monotonic()
                if seen is None:
                    elapsed = max(time.time() - process.create_time(), 1e-3)
                    used = cpu
                else:
                    elapsed, used = max(now - seen.at, 1e-3), max(cpu - seen.cpu_seconds, 0.0)
        except psutil.Error:
            self._seen.pop(pid, None)
            return None
        self._seen[pid] = _Seen(process, cpu, now)
        return ProcessSample(rss, round(100.0 * used / elapsed, 1))

    def forget_others(self, pids: set[int]) -> None:
        """Drop the processes not in `pids` (stubs that were replaced or stopped)."""
        for pid in set(self._seen) - pids:
            del self._seen[pid]
