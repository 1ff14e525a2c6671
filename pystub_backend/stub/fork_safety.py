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
                 `initialize`). A native thread's owner is the library of the routine it was
                 started on, which the C library keeps in the thread's descriptor at the top of
                 the thread's stack (read in this very process: the thread is parked in a system
                 call, its stack pointer is in /proc/self/task/<tid>/syscall); for a std::thread,
                 whose routine is the C++ library's, the library that made its state. Not a scan
                 of the stack for code addresses: a stack holds stale words of the calls and the
                 threads that used it before (the C library reuses the stacks of ended threads)
    GPU          no NVIDIA device mapped (a CUDA context) and, when torch is imported, CUDA not
                 initialized in it
    sockets      no socket open but the template's own: a connection the children shared would
                 interleave their bytes

`fork_refusal` answers with the reason in words, or None.
"""

from __future__ import annotations

import bisect
import ctypes
import functools
import os
import stat
import struct
import sys
import threading
import time
from typing import NamedTuple

__all__ = ["fork_refusal", "task_ids", "thread_owner", "SETTLE_SECONDS", "FORK_AWARE"]

SETTLE_SECONDS = 2.0
_POLL = 0.02
# Libraries whose worker threads survive a fork of their process (each prepares for it itself).
FORK_AWARE = ("libtorch_cpu", "openblas")
_STD_THREAD_LIBRARY = "libstdc++"
_DESCRIPTOR_BYTES = 4096  # more than glibc's struct pthread (2.3 KiB on x86-64)
_SCAN_CHUNK = 64 * 1024
_WORD = struct.Struct("<Q")
_TID = struct.Struct("<i")


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


def _file_mappings(executable: bool) -> tuple[list[int], list[tuple[int, str]]]:
    """(starts, [(end, path)]) of this process's file mappings (executable ones only, if so
    asked), sorted, for bisecting."""
    regions = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/") and (not executable or "x" in fields[1]):
                start, end = (int(part, 16) for part in fields[0].split("-"))
                regions.append((start, end, fields[5].strip()))
    regions.sort()
    return [start for start, _, _ in regions], [(end, path) for _, end, path in regions]


def _library_at(address: int, executable: bool = True) -> str | None:
    """The file name of the library mapped at `address`, or None."""
    starts, ends = _file_mappings(executable)
    index = bisect.bisect_right(starts, address) - 1
    if index >= 0 and address < ends[index][0]:
        return os.path.basename(ends[index][1])
    return None


class _ThreadLayout(NamedTuple):
    """Where the C library's thread descriptor (glibc's `struct pthread`) keeps a thread's start
    routine (its argument follows it) and its kernel thread id: byte offsets."""

    start_routine: int
    tid: int


@functools.cache
def _thread_layout() -> _ThreadLayout | None:
    """Found, not assumed (the layout changes between C library versions): a thread is started on a
    known routine (getppid, which returns at once) and a known argument, and its descriptor read
    back; the calling thread's descriptor tells where the id is. None where the C library keeps
    no such descriptor."""
    try:
        libc = ctypes.CDLL(None)
        create, join, self_ = libc.pthread_create, libc.pthread_join, libc.pthread_self
    except (OSError, AttributeError):
        return None
    create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    join.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
    self_.restype = ctypes.c_ulong
    routine, argument, handle = ctypes.cast(libc.getppid, ctypes.c_void_p).value, 0x5EED_F0CC_5EED, ctypes.c_ulong()
    if create(ctypes.byref(handle), None, routine, argument) != 0:
        return None
    try:
        words = _memory(handle.value, _readable_bytes(handle.value, _DESCRIPTOR_BYTES))
    finally:
        join(handle.value, None)
    starts = [offset for offset in range(0, len(words) - 15, 8)
              if _WORD.unpack_from(words, offset)[0] == routine and _WORD.unpack_from(words, offset + 8)[0] == argument]
    own = _memory(self_(), _readable_bytes(self_(), _DESCRIPTOR_BYTES))
    tids = [offset for offset in range(24, len(own) - 3, 4)
            if _TID.unpack_from(own, offset)[0] == threading.get_native_id()]
    return _ThreadLayout(starts[0], tids[0]) if len(starts) == 1 and tids else None


def thread_owner(tid: int) -> str | None:
    """The file name of the library that started thread `tid` of this process (see the module
    docstring), or None when it cannot be told (running, ended, a stack of its own)."""
    layout = _thread_layout()
    stack = _stack_pointer(tid)
    if layout is None or stack is None:
        return None
    descriptor = _descriptor(tid, stack, layout)
    if descriptor is None:
        return None
    start = _memory(descriptor + layout.start_routine, 16)
    if len(start) < 16:
        return None
    routine, argument = struct.unpack("<QQ", start)
    owner = _library_at(routine)
    state = _memory(argument, 8) if owner is not None and owner.startswith(_STD_THREAD_LIBRARY) else b""
    if len(state) == 8:
        # std::thread starts every thread on one trampoline; its argument is the thread's state,
        # whose first word is the vtable of the state's class, made where the thread was created.
        owner = _library_at(_WORD.unpack(state)[0], executable=False) or owner
    return owner


def _stack_pointer(tid: int) -> int | None:
    """Where thread `tid` has its stack pointer while it waits in a system call, or None."""
    try:
        with open(f"/proc/self/task/{tid}/syscall") as syscall:
            fields = syscall.read().split()
    except OSError:
        return None
    return None if len(fields) < 3 or fields[0] == "running" else int(fields[-2], 16)


def _descriptor(tid: int, stack: int, layout: _ThreadLayout) -> int | None:
    """The address of thread `tid`'s descriptor: the C library puts it at the top of the stack it
    allocates, and it begins with pointers to itself (the TLS header's `tcb` and `self`)."""
    span = _mapping_span(stack)
    if span is None:
        return None
    address = stack & ~7
    while True:
        size = min(_SCAN_CHUNK, span[1] - address)
        data = _memory(address, size)
        if len(data) < size:
            return None  # unmapped meanwhile: the thread ended
        words = memoryview(data).cast("Q")
        for index in range(len(words) - 2):
            here = address + 8 * index
            if words[index] == here and words[index + 2] == here and _is_descriptor_of(tid, here, layout):
                return here
        if address + size >= span[1]:
            return None
        address += size - 16  # the chunks overlap: a descriptor's `self` word may lie in the next one


def _is_descriptor_of(tid: int, address: int, layout: _ThreadLayout) -> bool:
    needed = max(layout.start_routine + 16, layout.tid + 4)
    fields = _memory(address, needed)  # reads short where the descriptor would leave the mapping
    return len(fields) == needed and _TID.unpack_from(fields, layout.tid)[0] == tid


def _mapping_span(address: int) -> tuple[int, int] | None:
    """The readable mapping around `address`, or None."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, permissions = line.split(maxsplit=2)[:2]
            start, end = (int(part, 16) for part in span.split("-"))
            if start <= address < end:
                return (start, end) if permissions.startswith("r") else None
    return None


def _memory(address: int, size: int) -> bytes:
    """`size` bytes of this process's memory at `address`, read through /proc/self/mem: a stack
    unmapped meanwhile (its thread ended) reads short or fails, where a direct read would crash
    the process. Short (b"" at worst) when not all of it is mapped."""
    if size <= 0:
        return b""
    try:
        fd = os.open("/proc/self/mem", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.pread(fd, size, address)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _readable_bytes(address: int, wanted: int) -> int:
    """How many of the `wanted` bytes from `address` lie in its readable mapping (0: none)."""
    span = _mapping_span(address)
    return 0 if span is None else min(wanted, span[1] - address)


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
