"""Whether a shared-weights template may fork: what would not survive in the children.

A fork copies one thread, the caller. Anything another thread was doing at that moment (holding a
lock, parked in a worker pool that believes it still has its workers) is frozen forever in the
child, and the next call that needs it hangs; a GPU context is not usable in a child at all. So a
template forks only when, after the model's `initialize`:

    threads      none but its own main thread, beyond those the stub had before the model was
                 loaded (numpy's BLAS pool, started when pystub imports numpy) and the workers of
                 pools that prepare for a fork themselves (FORK_AWARE: OpenBLAS stops its pool
                 around a fork, PyTorch's pthreadpool is made anew in a child). pystub's own
                 threads are stopped first (the "forking" phase), and threads that are ending get
                 `SETTLE_SECONDS` to be gone (GNU OpenMP's pool ends with the thread that ran
                 `initialize`). A native thread's owner is the library of the first return address
                 on its stack outside the C library (read in this very process: the thread is
                 parked in a system call, its stack pointer is in /proc/self/task/<tid>/syscall)
    GPU          no NVIDIA device mapped (a CUDA context) and, when torch is imported, CUDA not
                 initialized in it
    sockets      no socket open but the template's own: a connection the children shared would
                 interleave their bytes

`fork_refusal` answers with the reason in words, or None.
"""

from __future__ import annotations

import bisect
import ctypes
import os
import stat
import struct
import sys
import threading
import time

__all__ = ["fork_refusal", "task_ids", "thread_owner", "SETTLE_SECONDS", "FORK_AWARE"]

SETTLE_SECONDS = 2.0
_POLL = 0.02
# Libraries whose worker threads survive a fork of their process (each prepares for it itself).
FORK_AWARE = ("libtorch_cpu", "openblas")
_C_LIBRARY = ("libc.so", "libc-", "ld-linux", "libpthread")
_STACK_SCAN_BYTES = 16 * 1024
_WORD = struct.Struct("<Q")


def task_ids() -> set[int]:
    """The kernel's threads of this process."""
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def _thread_names(tids: set[int]) -> list[str]:
    by_native = {thread.native_id: thread.name for thread in threading.enumerate()}
    names = []
    for tid in sorted(tids):
        name = by_native.get(tid)
        if name is None:
            owner = thread_owner(tid)
            name = f"a native thread of {owner}" if owner else "a native thread"
        names.append(f"{name} (tid {tid})")
    return names


def _executable_mappings() -> tuple[list[int], list[tuple[int, str]]]:
    """(starts, [(end, path)]) of the executable file mappings, sorted, for bisecting."""
    regions = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and "x" in fields[1] and fields[5].startswith("/"):
                start, end = (int(part, 16) for part in fields[0].split("-"))
                regions.append((start, end, fields[5].strip()))
    regions.sort()
    return [start for start, _, _ in regions], [(end, path) for _, end, path in regions]


def thread_owner(tid: int) -> str | None:
    """The file name of the library that runs thread `tid` of this process (see the module
    docstring), or None when it cannot be told (running, ended, no such library on its stack)."""
    try:
        with open(f"/proc/self/task/{tid}/syscall") as syscall:
            fields = syscall.read().split()
    except OSError:
        return None
    if len(fields) < 3 or fields[0] == "running":
        return None
    stack = int(fields[-2], 16)
    starts, ends = _executable_mappings()
    data = ctypes.string_at(stack, _readable_bytes(stack))
    for (word,) in _WORD.iter_unpack(data):
        index = bisect.bisect_right(starts, word) - 1
        if index >= 0 and word < ends[index][0]:
            name = os.path.basename(ends[index][1])
            if not name.startswith(_C_LIBRARY):
                return name
    return None


def _readable_bytes(address: int) -> int:
    """How many bytes from `address` to read: up to `_STACK_SCAN_BYTES`, within its mapping (a
    thread's stack, whose top holds the thread's own control block); 0 when it is not readable."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, permissions = line.split(maxsplit=2)[:2]
            start, end = (int(part, 16) for part in span.split("-"))
            if start <= address < end:
                return min(_STACK_SCAN_BYTES, end - address) if permissions.startswith("r") else 0
    return 0


def _fork_aware(tid: int) -> bool:
    owner = thread_owner(tid)
    return owner is not None and any(name in owner for name in FORK_AWARE)


def _extra_threads(baseline: set[int], settle: float) -> set[int]:
    main = threading.main_thread().native_id
    python_threads = {thread.native_id for thread in threading.enumerate()}
    deadline = time.monotonic() + settle
    while True:
        extra = {tid for tid in task_ids() - baseline - {main}
                 if tid in python_threads or not _fork_aware(tid)}
        if not extra or time.monotonic() >= deadline:
            return extra
        time.sleep(_POLL)


def _gpu_context() -> str | None:
    try:
        with open("/proc/self/maps") as maps:
            if any("/dev/nvidia" in line for line in maps):
                return "an NVIDIA device is mapped (a CUDA context was created)"
    except OSError:
        pass
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    is_initialized = getattr(cuda, "is_initialized", None)
    if callable(is_initialized) and is_initialized():
        return "torch has initialized CUDA"
    return None


def _sockets(own: set[int]) -> list[int]:
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd in own:
            continue
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                found.append(fd)
        except OSError:
            continue  # the listing's own descriptor, or one closed meanwhile
    return found


def fork_refusal(baseline: set[int], own_fds: set[int], settle: float = SETTLE_SECONDS) -> str | None:
    """Why this process must not fork its instances now, or None. `baseline`: the threads it had
    before the model was loaded; `own_fds`: the sockets that are the template's own."""
    extra = _extra_threads(baseline, settle)
    if extra:
        return (f"initialize left {len(extra)} thread(s) running: {', '.join(_thread_names(extra))}; "
                f"a fork would copy none of them")
    gpu = _gpu_context()
    if gpu is not None:
        return f"{gpu}; a GPU context does not survive a fork"
    sockets = _sockets(own_fds)
    if sockets:
        return (f"initialize left {len(sockets)} socket(s) open (descriptors {sockets}); the instances "
                f"would share them")
    return None
