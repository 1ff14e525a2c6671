"""CPU seconds from /proc and getrusage: a server's leader process, its descendants (pystub's
stubs), and the load generator (this process, or the child processes it has waited for)."""

from __future__ import annotations

import contextlib
import os
import resource
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def process_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime: fields 14 and 15 of proc(5)


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                for child in map(int, Path(f"/proc/{pid}/task/{task}/children").read_text().split()):
                    found += [child, *descendants(child)]
    return found


def now(server_pid: int, client: int = resource.RUSAGE_SELF) -> tuple[float, float, float]:
    """(server leader, its descendants, the load generator) CPU seconds so far. `client`:
    RUSAGE_SELF where this process generates the load, RUSAGE_CHILDREN where a child it waited
    for did (perf_analyzer)."""
    usage = resource.getrusage(client)
    return (process_seconds(server_pid), sum(process_seconds(c) for c in descendants(server_pid)),
            usage.ru_utime + usage.ru_stime)


def per_request_us(before: tuple[float, ...], after: tuple[float, ...], requests: float) -> list[float]:
    """Microseconds of CPU per request between two `now()` readings."""
    return [1e6 * (end - start) / requests if requests else float("nan")
            for start, end in zip(before, after, strict=True)]
