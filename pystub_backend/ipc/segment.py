"""One anonymous shared-memory segment (a sealed memfd), mapped into this process.

pystub's arenas and control blocks have no name: a segment is a `memfd_create` object whose only
handles are file descriptors. The process that writes it creates it and hands a descriptor to its
peer over the stub's socket (SCM_RIGHTS, see channel.py); nothing appears in /dev/shm and no other
process can open it by a name.

    Segment.create(label, size)   memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING),
                                  posix_fallocate(size) (pages reserved now: running out of memory
                                  fails here with ENOSPC/ENOMEM, not with SIGBUS on first touch),
                                  seals SHRINK | GROW | SEAL, mapped read-write
    segment.take_fd()             its descriptor (read-only by default) for the peer; this
                                  process keeps none once it is sent
    Segment.from_fd(fd, writable) the peer's side: checks the seals, maps, never keeps `fd`

The seals make the size fixed for everyone: a peer cannot shrink memory this process has mapped
(which would turn the next read into SIGBUS), and `from_fd` refuses an object without them (a
plain file, an unsealed memfd), so a stub cannot hand the backend such a thing either. The label
only shows in /proc/<pid>/maps and /proc/<pid>/fd links; it opens nothing.

`close()` unmaps and closes the creator's descriptor; the memory goes when the last mapping and
descriptor anywhere are gone, so a process killed with SIGKILL leaves nothing behind.
"""

from __future__ import annotations

import fcntl
import mmap
import os

__all__ = ["Segment", "SegmentCreateError", "REQUIRED_SEALS"]

# The seals every segment carries: its size is fixed and no seal can be added or removed later.
REQUIRED_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class SegmentCreateError(OSError):
    """The segment could not be created, reserved, or mapped; the message names it."""


class Segment:
    def __init__(self, label: str, buffer: mmap.mmap, size: int, writable: bool, fd: int = -1) -> None:
        self.name = label
        self.size = size
        self.writable = writable
        self._fd = fd  # the creator's descriptor until take_fd hands it over; a peer keeps none
        self._mmap: mmap.mmap | None = buffer
        self.view = memoryview(buffer)

    @classmethod
    def create(cls, label: str, size: int) -> Segment:
        """Create, reserve, seal and map an anonymous segment of `size` bytes. Raises
        SegmentCreateError (nothing is left behind: the descriptor is the only handle)."""
        try:
            fd = os.memfd_create(label, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError as exc:
            raise SegmentCreateError(f"cannot create shared memory '{label}': {exc}") from exc
        try:
            os.posix_fallocate(fd, 0, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, REQUIRED_SEALS)
            buffer = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            os.close(fd)  # crash-safe: the memory goes with its only descriptor
            raise SegmentCreateError(f"cannot reserve {size} bytes for shared memory '{label}': "
                                     f"{os.strerror(exc.errno) if exc.errno else exc}") from exc
        return cls(label, buffer, size, writable=True, fd=fd)

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
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            buffer = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
        except (OSError, ValueError) as exc:  # ValueError: an empty object cannot be mapped
            raise SegmentCreateError(f"cannot map shared memory {what}: {exc}") from exc
        return cls(label, buffer, size, writable)

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
        """Unmap and close. Views still exported (e.g. numpy arrays a model kept) keep the
        mapping alive until they are collected."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._mmap is None:
            return
        try:
            self.view.release()
            self._mmap.close()
        except BufferError:
            pass  # an exported view still uses it; the mapping goes when that view is collected
        self._mmap = None
