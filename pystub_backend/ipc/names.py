"""Labels of pystub's shared memory, and the sweep of named objects older versions left behind.

pystub's own segments are anonymous memfds (segment.py); `stub_base_name` gives each stub
incarnation the label `<prefix>_<owner pid>_<token>` that its segments carry in /proc/<pid>/maps
(`/memfd:<label>_<purpose><index>`): the owner pid and the random token tell incarnations apart
when reading those tables, and a label opens nothing.

Versions before anonymous arenas created `/dev/shm/<prefix>_<owner pid>_<token>_<purpose>`
objects, which a SIGKILLed server left behind; `sweep_stale` still removes such leftovers whose
owner pid is dead (nothing new needs it). `owned_entries` / `unlink_entries` list and remove them.
"""

from __future__ import annotations

import os
import re
import secrets

__all__ = ["DEFAULT_PREFIX", "SHM_DIR", "stub_base_name", "validate_prefix", "sweep_stale", "owned_entries",
           "unlink_entries", "pid_alive"]

DEFAULT_PREFIX = "pystub"
SHM_DIR = "/dev/shm"
_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def validate_prefix(prefix: str) -> str:
    """Return `prefix`, or raise ValueError when it cannot be part of a shm name."""
    if not _PREFIX_RE.match(prefix):
        raise ValueError(f"invalid shared memory prefix {prefix!r}: use 1-64 of [A-Za-z0-9_.-]")
    return prefix


def stub_base_name(prefix: str, owner_pid: int | None = None) -> str:
    """A fresh base name for one stub incarnation: `<prefix>_<pid>_<token>`."""
    pid = os.getpid() if owner_pid is None else owner_pid
    return f"{validate_prefix(prefix)}_{pid}_{secrets.token_hex(6)}"


def owned_entries(base: str) -> list[str]:
    """Names (without `/dev/shm/`) of the objects whose name starts with `base`."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return [name for name in names if name.startswith(base)]


def unlink_entries(names: list[str]) -> None:
    """Unlink what exists and may be unlinked; another user's stale objects are left alone."""
    for name in names:
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except (FileNotFoundError, PermissionError):
            pass


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (it may belong to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(prefix: str) -> list[str]:
    """Unlink `<prefix>_<pid>_...` objects whose owner pid is dead; return what was removed."""
    pattern = re.compile(rf"^{re.escape(prefix)}_(\d+)_")
    stale = []
    for name in owned_entries(prefix + "_"):
        match = pattern.match(name)
        if match and not pid_alive(int(match.group(1))):
            stale.append(name)
    unlink_entries(stale)
    return stale
