"""Device buffers a stub owns (its BLS exports, outputs copied onto a GPU), reused rather than freed.

    take(device, nbytes) ──▶ a cached block of nbytes' size class, else cudaMalloc
    give(device, pointer) ──▶ back to the cache; past `keep_bytes` per device, cudaFree

cudaFree synchronizes the whole device (every stream of this process on it waits), so freeing a
buffer per tensor would stall the model's own work each time; blocks are kept instead, in power-of-
two size classes (at most twice what is asked), as a caching allocator does. A block given back may
still be read by work the model queued on its default stream; the next copy into it is queued on
pystub's blocking stream, which runs after that work. Each block is a whole cudaMalloc block, so
CUDA can always export it.
"""

from __future__ import annotations

import threading

from pystub_backend.devices.interface import DeviceMemory

__all__ = ["BufferPool", "KEEP_BYTES"]

KEEP_BYTES = 256 << 20  # cached, not in use, per device
_SMALLEST = 512


def _size_class(nbytes: int) -> int:
    return max(_SMALLEST, 1 << (nbytes - 1).bit_length())


class BufferPool:
    """Thread-safe; device ids are the server's."""

    def __init__(self, memory: DeviceMemory, keep_bytes: int = KEEP_BYTES) -> None:
        self._memory = memory
        self._keep = keep_bytes
        self._lock = threading.Lock()
        self._free: dict[tuple[int, int], list[int]] = {}  # (device, size class) -> cached blocks
        self._sizes: dict[tuple[int, int], int] = {}  # (device, pointer) -> size class, in use or cached
        self._cached: dict[int, int] = {}  # device -> bytes cached

    def take(self, device_id: int, nbytes: int) -> int:
        """A block of at least `nbytes` on the device (0 for 0 bytes). Raises DeviceError."""
        if nbytes == 0:
            return 0
        size = _size_class(nbytes)
        with self._lock:
            blocks = self._free.get((device_id, size))
            if blocks:
                self._cached[device_id] -= size
                return blocks.pop()
        pointer = self._memory.alloc(device_id, size)
        with self._lock:
            self._sizes[(device_id, pointer)] = size
        return pointer

    def give(self, device_id: int, pointer: int) -> None:
        """A block from `take` is free again. Raises DeviceError (a free that failed)."""
        if pointer == 0:
            return
        with self._lock:
            size = self._sizes[(device_id, pointer)]
            keep = self._cached.get(device_id, 0) + size <= self._keep
            if keep:
                self._free.setdefault((device_id, size), []).append(pointer)
                self._cached[device_id] = self._cached.get(device_id, 0) + size
                return
            del self._sizes[(device_id, pointer)]
        self._memory.free(device_id, pointer)

    def cached_bytes(self, device_id: int) -> int:
        with self._lock:
            return self._cached.get(device_id, 0)

    def close(self) -> None:
        """Free every cached block (blocks still in use stay theirs)."""
        with self._lock:
            cached = [(device, pointer) for (device, _), blocks in self._free.items() for pointer in blocks]
            self._free.clear()
            self._cached.clear()
            for key in cached:
                del self._sizes[key]
        for device, pointer in cached:
            self._memory.free(device, pointer)
