"""Keeping other processes of the same user out of this one's memory.

Arenas have no names (segment.py), but a process of the same uid could still reach another's
memory through /proc/<pid>/mem, /proc/<pid>/fd and /proc/<pid>/map_files. Marking the process
non-dumpable (prctl PR_SET_DUMPABLE 0) makes those entries root-owned and refuses access to anyone
without CAP_SYS_PTRACE; a container's root has no such capability by default. The price: no core
dump of this process, and same-uid debuggers (py-spy, gdb -p) need that capability too. The flag is
reset by execve, so a program the model starts is dumpable again (and holds none of our memory).
"""

from __future__ import annotations

import ctypes

__all__ = ["forbid_inspection", "inspection_forbidden"]

_PR_SET_DUMPABLE = 4
_PR_GET_DUMPABLE = 3


def _prctl(option: int, value: int) -> int:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0))
    except (OSError, AttributeError):  # not Linux: there is no /proc to protect
        return -1


def forbid_inspection() -> None:
    """Make this process non-dumpable (see the module docstring). Never raises."""
    _prctl(_PR_SET_DUMPABLE, 0)


def inspection_forbidden() -> bool:
    """Whether this process is non-dumpable."""
    return _prctl(_PR_GET_DUMPABLE, 0) == 0
