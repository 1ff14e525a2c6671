"""One anonymous shared-memory segment (a sealed memfd), mapped into this process.

pystub's arenas and control blocks have no name: a segment is a `memfd_create` object whose only
handles are file descriptors. The process that writes it creates it and hands a descriptor to its
peer over the stub's socket (SCM_RIGHTS, see channel.py); nothing appears in /dev/shm and no other
process can open it by a name.

    Segment.create(label, size)   memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING),
                                  posix_fallocate(size) (pages reserved now: running out of memory
                                  fails here with ENOMEM, not with SIGBUS on first touch; a size
                                  beyond the memory available is refused before any page is taken),
                                  seals SHRINK | GROW | SEAL, mapped read-write
    segment.take_fd()             its descriptor (read-only by default) for the peer; this
                                  process keeps none once it is sent
    Segment.from_fd(fd, writable) the peer's side: checks the seals, maps, never keeps `fd`

The seals make the size fixed for everyone: a peer cannot shrink memory this process has mapped
(which would turn the next read into SIGBUS), and `from_fd` refuses an object without them (a
plain file, an unsealed memfd), so a stub cannot hand the backend such a thing either. The label
only shows in /proc/<pid>/maps and /proc/<pid>/fd links; it opens nothing.

Mappings are made with libc's mmap, not Python's `mmap.mmap`: the latter keeps a duplicate of the
descriptor open for as long as the mapping lives, which would leave every segment reachable
through /proc/<pid>/fd. The mapping is a ctypes array; it is unmapped when the last view of it
is collected, so a view a model kept stays valid after `close()`.

`close()` drops this object's hold and closes the creator's descriptor; the memory goes when the
last mapping and descriptor anywhere are gone, so a process killed with SIGKILL leaves nothing.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import weakref

__all__ = ["Segment", "SegmentCreateError", "REQUIRED_SEALS", "available_memory"]

# The seals every segment carries: its size is fixed and no seal can be added or removed later.
REQUIRED_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class SegmentCreateError(OSError):
    """The segment could not be created, reserved, or mapped; the message names it."""


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def _map(fd: int, size: int, writable: bool) -> memoryview:
    """Map `size` bytes of `fd` shared; a byte view (read-only unless `writable`) whose mapping is
    unmapped when the last view of it is gone. Raises OSError. Keeps no descriptor."""
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    address = _libc.mmap(None, size, prot, mmap.MAP_SHARED, fd, 0)
    if address is None or address == _MAP_FAILED:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))

    class _Mapping(ctypes.c_ubyte * size):  # type: ignore[misc]  # a subclass can be weakly referenced
        pass

    array = _Mapping.from_address(address)
    weakref.finalize(array, _libc.munmap, address, size)
    view = memoryview(array).cast("B")
    return view if writable else view.toreadonly()


def _cgroup_files() -> list[tuple[str, str]]:
    """(limit, usage) files of this process's memory cgroup (v2 or v1, found through
    /proc/self/cgroup), then those of the mount's root (a container's own cgroup)."""
    found = []
    try:
        with open("/proc/self/cgroup") as handle:
            lines = handle.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        path = path.rstrip("/")
        if hierarchy == "0" and not controllers:
            found.append((f"/sys/fs/cgroup{path}/memory.max", f"/sys/fs/cgroup{path}/memory.current"))
        elif "memory" in controllers.split(","):
            found.append((f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes",
                          f"/sys/fs/cgroup/memory{path}/memory.usage_in_bytes"))
    return found + [("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")]


def _read_int(path: str) -> int | None:
    try:
        with open(path) as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_memory() -> int | None:
    """Bytes this process can still get: MemAvailable, lowered by a memory cgroup's headroom.
    None when unknown (no /proc)."""
    available = None
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    for limit_path, usage_path in _cgroup_files():
        limit, usage = _read_int(limit_path), _read_int(usage_path)  # "max" (no limit) reads as None
        if limit is not None and usage is not None and limit < 1 << 60:
            headroom = max(0, limit - usage)
            available = headroom if available is None else min(available, headroom)
            break
    return available


def _check_available(label: str, size: int) -> None:
    """Refuse a segment that memory cannot hold. A memfd has no size limit of its own (unlike a
    /dev/shm tmpfs), so without this check posix_fallocate would take pages until the memory
    cgroup's OOM killer picks a process instead of returning an error."""
    available = available_memory()
    if available is not None and size > available:
        raise SegmentCreateError(f"cannot reserve {size} bytes for shared memory '{label}': only "
                                 f"{available} bytes of memory are available")


class Segment:
    def __init__(self, label: str, view: memoryview, size: int, writable: bool, fd: int = -1) -> None:
        self.name = label
        self.size = size
        self.writable = writable
        self._fd = fd  # the creator's descriptor until take_fd hands it over; a peer keeps none
        self.view = view

    @classmethod
    def create(cls, label: str, size: int) -> Segment:
        """Create, reserve, seal and map an anonymous segment of `size` bytes. Raises
        SegmentCreateError (nothing is left behind: the descriptor is the only handle)."""
        _check_available(label, size)
        try:
            fd = os.memfd_create(label, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError as exc:
            raise SegmentCreateError(f"cannot create shared memory '{label}': {exc}") from exc
        try:
            os.posix_fallocate(fd, 0, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, REQUIRED_SEALS)
            view = _map(fd, size, writable=True)
        except OSError as exc:
            os.close(fd)  # crash-safe: the memory goes with its only descriptor
            raise SegmentCreateError(f"cannot reserve {size} bytes for shared memory '{label}': "
                                     f"{os.strerror(exc.errno) if exc.errno else exc}") from exc
        return cls(label, view, size, writable=True, fd=fd)

    @classmethod
    def from_fd(cls, fd: int, writable: bool = False, label: str = "") -> Segment:
        """Map the segment behind `fd` (the caller still owns and closes `fd`). Raises
        SegmentCreateError for anything that is not a sealed, non-empty memfd segment."""
        what = label or f"descriptor {fd}"
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError as exc:  # EINVAL: not a memfd (a file, a socket, a /dev/shm object)
            raise SegmentCreateError(f"shared memory {what} is not an anonymous segment: {exc}") from exc
        if seals & REQUIRED_SEALS != REQUIRED_SEALS:
            raise SegmentCreateError(f"shared memory {what} is not sealed against shrinking "
                                     f"(seals {seals:#x})")
        try:
            size = os.fstat(fd).st_size
            view = _map(fd, size, writable)  # an empty object fails here (EINVAL)
        except OSError as exc:
            raise SegmentCreateError(f"cannot map shared memory {what}: {exc}") from exc
        return cls(label, view, size, writable)

    def take_fd(self, writable: bool = False) -> int:
        """The descriptor for the peer, read-only unless asked (a read-only descriptor cannot be
        mapped or mprotect-ed writable). A segment is handed over once: this process keeps no
        descriptor afterwards, so /proc/<pid>/fd of this process shows none. The caller closes
        the returned descriptor once it is sent."""
        fd, self._fd = self._fd, -1
        if fd < 0:
            raise SegmentCreateError(f"shared memory '{self.name}' has no descriptor to hand over")
        if writable:
            return fd
        try:
            # Reopening through /proc gives the same object with a read-only open file description.
            return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Close the creator's descriptor and drop this object's view. The mapping goes once no
        view of it remains (numpy arrays a model kept hold it until they are collected)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            self.view.release()
        except BufferError:
            pass  # an exported view still uses it; the mapping goes when that view is collected
        self.view = memoryview(b"")
