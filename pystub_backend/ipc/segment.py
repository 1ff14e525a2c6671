"""One POSIX shared-memory segment, mapped into this process.

`Segment.create` makes the object with O_CREAT|O_EXCL and mode 0600, reserves its pages with
posix_fallocate (so a full /dev/shm fails here, with ENOSPC, instead of with SIGBUS when a page is
first touched later), and maps it read-write. `Segment.attach` maps an existing object, read-only
unless asked otherwise. `close()` unmaps; it never unlinks: only the backend unlinks (names.py).
"""

from __future__ import annotations

import mmap
import os

import posix_ipc

__all__ = ["Segment", "SegmentCreateError"]


class SegmentCreateError(OSError):
    """The segment could not be created or its pages reserved; the message names it."""


class Segment:
    def __init__(self, name: str, buffer: mmap.mmap, size: int, writable: bool) -> None:
        self.name = name
        self.size = size
        self.writable = writable
        self._mmap: mmap.mmap | None = buffer
        self.view = memoryview(buffer)

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        """Create, reserve and map `name` (without the leading slash). Raises SegmentCreateError."""
        try:
            shm = posix_ipc.SharedMemory("/" + name, posix_ipc.O_CREX, mode=0o600, size=0)
        except posix_ipc.Error as exc:
            raise SegmentCreateError(f"cannot create shared memory '{name}': {exc}") from exc
        try:
            os.posix_fallocate(shm.fd, 0, size)
            buffer = mmap.mmap(shm.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            # Crash-safe construction: nothing half-built survives a failure.
            shm.close_fd()
            shm.unlink()
            raise SegmentCreateError(f"cannot reserve {size} bytes for shared memory '{name}': "
                                     f"{os.strerror(exc.errno) if exc.errno else exc}") from exc
        shm.close_fd()
        return cls(name, buffer, size, writable=True)

    @classmethod
    def attach(cls, name: str, writable: bool = False) -> Segment:
        """Map an existing segment. Raises SegmentCreateError when it does not exist or cannot be
        mapped (e.g. it is empty)."""
        try:
            shm = posix_ipc.SharedMemory("/" + name, read_only=not writable)
        except posix_ipc.Error as exc:
            raise SegmentCreateError(f"cannot open shared memory '{name}': {exc}") from exc
        try:
            size = os.fstat(shm.fd).st_size
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            buffer = mmap.mmap(shm.fd, size, mmap.MAP_SHARED, prot)
        except (OSError, ValueError) as exc:  # ValueError: an empty object cannot be mapped
            raise SegmentCreateError(f"cannot map shared memory '{name}': {exc}") from exc
        finally:
            shm.close_fd()
        return cls(name, buffer, size, writable)

    def close(self) -> None:
        """Unmap. Views still exported (e.g. numpy arrays a model kept) keep the mapping alive."""
        if self._mmap is None:
            return
        try:
            self.view.release()
            self._mmap.close()
        except BufferError:
            pass  # an exported view still uses it; the mapping goes when that view is collected
        self._mmap = None
