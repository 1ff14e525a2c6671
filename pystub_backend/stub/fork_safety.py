"""Whether a shared-weights template may fork: what would not survive in the children.

A fork copies one thread, the caller. Anything another thread was doing at that moment (holding a
lock, parked in a worker pool that believes it still has its workers) is frozen forever in the
child, and the next call that needs it hangs; a GPU context is not usable in a child at all. So a
template forks only when, after the model's `initialize`:

    threads      none but its own main thread, beyond those the stub had before the model was
                 loaded (numpy's BLAS pool, started when pystub imports numpy: OpenBLAS stops and
                 restarts it around a fork by itself). pystub's own threads are stopped first (the
                 "forking" phase), and threads that are ending get `SETTLE_SECONDS` to be gone
                 (GNU OpenMP's pool ends with the thread that ran `initialize`)
    GPU          no NVIDIA device mapped (a CUDA context) and, when torch is imported, CUDA not
                 initialized in it
    sockets      no socket open but the template's own: a connection the children shared would
                 interleave their bytes

`fork_refusal` answers with the reason in words, or None.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
import time

__all__ = ["fork_refusal", "task_ids", "SETTLE_SECONDS"]

SETTLE_SECONDS = 2.0
_POLL = 0.02


def task_ids() -> set[int]:
    """The kernel's threads of this process."""
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def _thread_names(tids: set[int]) -> list[str]:
    by_native = {thread.native_id: thread.name for thread in threading.enumerate()}
    names = []
    for tid in sorted(tids):
        name = by_native.get(tid)
        if name is None:
            try:
                with open(f"/proc/self/task/{tid}/comm") as comm:
                    name = f"native thread '{comm.read().strip()}'"
            except OSError:
                continue  # ended meanwhile
        names.append(f"{name} (tid {tid})")
    return names


def _extra_threads(baseline: set[int], settle: float) -> set[int]:
    main = threading.main_thread().native_id
    deadline = time.monotonic() + settle
    while True:
        extra = task_ids() - baseline - {main}
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
