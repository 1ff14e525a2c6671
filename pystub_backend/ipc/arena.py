"""Arenas: growable shared memory with exactly one writer.

An arena is a list of anonymous segments (sealed memfds, segment.py) labelled
`<base>_<purpose><index>`. The writer creates them, allocates, copies data in, and hands out
`Handle`s; each new segment's descriptor goes to the reader's process with the next frame the
writer's side sends (`take_new_fds`, carried by channel.py as SCM_RIGHTS), so it arrives no later
than the first frame that can name it, and the reader maps it (`add_fds`, read-only) before that
frame is handled. The reader never frees: it sends the handle back in a release message and the
writer frees it. One writer per arena means no cross-process lock exists that a crashed peer
could leave held. Neither side keeps a descriptor once a segment is mapped on both sides.

    Handle = (segment index, offset, nbytes)          segment -1: an empty tensor, nothing stored

The first segment has `default_size` bytes (or the smallest multiple of it that fits the first
request); growth adds a segment of `growth_size` bytes, or of the smallest multiple of it that fits
the request; data never moves. A failure to reserve the new segment's pages (out of memory, a
memory cgroup limit) raises `ArenaFullError` with the text clients match, and leaves the arena as
it was. /dev/shm is not involved: its size does not limit an arena.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from pystub_backend.ipc.allocator import ALIGNMENT, Allocator
from pystub_backend.ipc.segment import Segment, SegmentCreateError

__all__ = ["Handle", "EMPTY_HANDLE", "ArenaWriter", "ArenaReader", "ArenaFullError", "segment_name"]

Handle = tuple[int, int, int]
EMPTY_HANDLE: Handle = (-1, 0, 0)


class ArenaFullError(MemoryError):
    """No room and no way to grow; the message starts with Triton's
    `Failed to increase the shared memory pool size`."""


def segment_name(base: str, purpose: str, index: int) -> str:
    """The label of a segment (shown in /proc/<pid>/maps; it opens nothing)."""
    return f"{base}_{purpose}{index}"


def _round_up(value: int, step: int) -> int:
    return (value + step - 1) // step * step


def _address(view: memoryview) -> int:
    """The address of the first byte of `view` (the temporary array is dropped at once, so the
    mapping keeps no export that would block closing it)."""
    import numpy as np

    return int(np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0])


class ArenaWriter:
    """The single writer of an arena. Thread-safe within its process."""

    def __init__(self, base: str, purpose: str, default_size: int, growth_size: int,
                 max_size: int | None = None) -> None:
        self.base = base
        self.purpose = purpose
        self.default_size = _round_up(default_size, ALIGNMENT)
        self.growth_size = _round_up(max(growth_size, ALIGNMENT), ALIGNMENT)
        self.max_size = max_size
        self._segments: list[Segment] = []
        self._allocators: list[Allocator] = []
        # For owns(): each segment's start address, and the ids of the mmaps behind the segments'
        # views (a cheap first test that rejects foreign buffers without computing addresses).
        self._addresses: list[int] = []
        self._exporters: set[int] = set()
        self.unsent_segments: list[Segment] = []  # created, descriptor not yet taken for the peer
        self._lock = threading.Lock()

    # -- sizes ---------------------------------------------------------------------------------
    @property
    def used(self) -> int:
        return sum(a.used for a in self._allocators)

    @property
    def total(self) -> int:
        return sum(a.size for a in self._allocators)

    @property
    def allocation_count(self) -> int:
        return sum(a.allocation_count for a in self._allocators)

    # -- allocation ------------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> Handle:
        """Reserve `nbytes`; grows the arena when needed. Raises ArenaFullError, and ValueError for a
        negative size."""
        if nbytes <= 0:
            if nbytes < 0:
                raise ValueError(f"cannot allocate {nbytes} bytes")
            return EMPTY_HANDLE
        with self._lock:
            for index, allocator in enumerate(self._allocators):
                offset = allocator.allocate(nbytes)
                if offset is not None:
                    return (index, offset, nbytes)
            index = self._grow(nbytes)
            offset = self._allocators[index].allocate(nbytes)
            assert offset is not None, "a fresh segment sized for the request must fit it"
            return (index, offset, nbytes)

    def _grow(self, nbytes: int) -> int:
        step = self.default_size if not self._segments else self.growth_size
        size = _round_up(max(nbytes, step), step)
        if self.max_size is not None and self.total + size > self.max_size:
            raise ArenaFullError(
                f"Failed to increase the shared memory pool size for key '{self.base}_{self.purpose}' "
                f"to {self.total + size} bytes: the limit is {self.max_size} bytes")
        name = segment_name(self.base, self.purpose, len(self._segments))
        try:
            segment = Segment.create(name, size)
        except SegmentCreateError as exc:
            raise ArenaFullError(
                f"Failed to increase the shared memory pool size for key '{name}' to {size} bytes. "
                f"Error: {exc}") from exc
        try:
            allocator, address = Allocator(size), _address(segment.view)
        except BaseException:
            segment.close()  # crash-safe: its descriptor was the only handle, nothing stays
            raise
        self.unsent_segments.append(segment)
        self._segments.append(segment)
        self._allocators.append(allocator)
        self._addresses.append(address)
        self._exporters.add(id(segment.view.obj))
        return len(self._segments) - 1

    def take_new_fds(self) -> list[int]:
        """Descriptors (read-only) of the segments created since the last call, in index order,
        for the reader's process. The caller sends them with its next frame and closes them."""
        if not self.unsent_segments:  # every frame asks: answer without the lock when nothing grew
            return []
        with self._lock:
            unsent, self.unsent_segments = self.unsent_segments, []
        return [segment.take_fd() for segment in unsent]

    def free(self, handle: Handle | list[int]) -> None:
        """Free a handle. Raises KeyError for a handle that is not allocated (double free) and
        IndexError for a segment this arena does not have."""
        index, offset, _ = handle
        if index < 0:
            if tuple(handle) != EMPTY_HANDLE:
                raise KeyError(f"handle {tuple(handle)} names no segment")
            return
        with self._lock:
            self._allocators[index].free(offset)

    def view(self, handle: Handle) -> memoryview:
        """A writable view of the handle's bytes."""
        index, offset, nbytes = handle
        if index < 0:
            return memoryview(bytearray(0))
        return self._segments[index].view[offset : offset + nbytes]

    def write(self, data: Any) -> Handle:
        """Allocate and copy `data` (any buffer, contiguous or not) in; returns its handle.

        Raises ArenaFullError, and TypeError for an object that is not a buffer.
        """
        if isinstance(data, (bytes, bytearray)):
            source: Any = data
        else:
            source = memoryview(data)
            if source.nbytes == 0:
                return EMPTY_HANDLE  # cast() refuses zeros in a shape such as (0, 5)
            # cast() accepts only C-contiguous views; anything else is gathered into bytes first.
            source = source.cast("B") if source.c_contiguous else memoryview(source.tobytes())
        nbytes = len(source)
        handle = self.allocate(nbytes)
        if nbytes:
            try:
                self.view(handle)[:] = source
            except BaseException:
                self.free(handle)  # a failed copy must not leak the allocation
                raise
        return handle

    def owns(self, buffer: Any) -> Handle | None:
        """The handle of a live allocation that `buffer` (a numpy array) lies in from its start, if any.

        Lets a caller skip a copy when the data already lives in this arena. Only arrays that view
        this arena's segments are considered (found through their `.base` chain, without touching
        the data); anything else, and anything not C-contiguous or empty, is None.
        """
        import numpy as np  # local: the allocator side of ipc has no numpy dependency otherwise

        if not isinstance(buffer, np.ndarray) or not self._exporters:
            return None
        base: Any = buffer
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        if id(getattr(base, "obj", None)) not in self._exporters:
            return None
        if not buffer.flags.c_contiguous or buffer.nbytes == 0:
            return None
        address = buffer.__array_interface__["data"][0]
        with self._lock:
            for index, start in enumerate(self._addresses):
                offset = address - start
                if 0 <= offset < self._segments[index].size:
                    allocator = self._allocators[index]
                    if allocator.is_allocated(offset) and buffer.nbytes <= allocator.block_size(offset):
                        return (index, offset, buffer.nbytes)
                    return None
        return None

    def close(self) -> None:
        """Unmap every segment and close any descriptor not handed over (views still exported
        keep their mapping alive)."""
        with self._lock:
            self.unsent_segments.clear()
            for segment in self._segments:
                segment.close()
            self._segments.clear()
            self._allocators.clear()
            self._addresses.clear()
            self._exporters.clear()


class ArenaReader:
    """Maps the segments of another process's arena as their descriptors arrive; never frees."""

    def __init__(self, base: str, purpose: str, writable: bool = False) -> None:
        self.base = base
        self.purpose = purpose
        self.writable = writable
        # By index: the mapped segment, or why the descriptor for that index could not be mapped.
        self._segments: list[Segment | SegmentCreateError] = []
        self._lock = threading.Lock()

    def add_fds(self, fds: list[int]) -> None:
        """Map the next segments from their descriptors (in index order) and close the
        descriptors. A descriptor that is not a sealed segment takes its index but every view of
        it raises SegmentCreateError (a peer cannot shift later segments' indices)."""
        for fd in fds:
            label = segment_name(self.base, self.purpose, len(self._segments))
            entry: Segment | SegmentCreateError
            try:
                entry = Segment.from_fd(fd, self.writable, label)
            except SegmentCreateError as exc:
                entry = exc
            finally:
                os.close(fd)
            with self._lock:
                self._segments.append(entry)

    def view(self, handle: Handle | list[int]) -> memoryview:
        """A view of the handle's bytes. Raises SegmentCreateError for a segment that was never
        handed over (or was refused) and ValueError for a handle outside its segment (a corrupt
        frame)."""
        index, offset, nbytes = handle
        if index < 0:
            if tuple(handle) != EMPTY_HANDLE:
                raise ValueError(f"handle {tuple(handle)} names no segment")
            return memoryview(b"")
        segments = self._segments
        if index >= len(segments):
            raise SegmentCreateError(f"segment {index} of arena '{self.base}_{self.purpose}' was never "
                                     f"handed over ({len(segments)} were)")
        segment = segments[index]
        if isinstance(segment, SegmentCreateError):
            raise SegmentCreateError(str(segment))
        if offset < 0 or nbytes < 0 or offset + nbytes > segment.size:
            raise ValueError(f"handle {tuple(handle)} lies outside segment {index} of {segment.size} bytes")
        return segment.view[offset : offset + nbytes]

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    def close(self) -> None:
        with self._lock:
            for segment in self._segments:
                if isinstance(segment, Segment):
                    segment.close()
            self._segments.clear()
