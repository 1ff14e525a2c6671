"""Outputs allocated straight in the s2p arena (pystub extension `pb_utils.new_output_array`).

A model that fills a large output can ask for its array in shared memory up front; returning it
then costs no copy: the response names the bytes where they already are. Each such array is
handed over once: the first response that carries it takes ownership (the backend frees it with a
release message); an array that is never sent is freed when it is collected; a second response
carrying the same array gets a copy, so the backend never frees a block twice.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

from pystub_backend.ipc.arena import ArenaWriter, Handle

__all__ = ["OutputBuffers", "install", "claim"]

_installed: OutputBuffers | None = None


class OutputBuffers:
    def __init__(self, writer: ArenaWriter) -> None:
        self._writer = writer
        self._unclaimed: dict[int, Handle] = {}  # id(array) -> its allocation, until sent
        self._lock = threading.Lock()

    def allocate(self, shape: Any, dtype: Any) -> np.ndarray:
        """A writable, zeroed-on-demand array in the arena. Raises ArenaFullError."""
        dtype = np.dtype(dtype)
        if dtype.hasobject:
            raise TypeError("new_output_array cannot hold object (BYTES) arrays; use a numpy array instead")
        shape = tuple(int(d) for d in np.atleast_1d(shape)) if not isinstance(shape, tuple) else shape
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        handle = self._writer.allocate(nbytes)
        array = np.frombuffer(self._writer.view(handle), dtype=dtype).reshape(shape) if nbytes else \
            np.empty(shape, dtype)
        if nbytes:
            with self._lock:
                self._unclaimed[id(array)] = handle
            weakref.finalize(array, self._collected, id(array))
        return array

    def claim(self, array: Any) -> Handle | None:
        """The allocation `array` is, if it is an unsent whole array from `allocate`; ownership
        passes to the response carrying it."""
        if not self._unclaimed or not isinstance(array, np.ndarray):  # the common model: it allocates none
            return None
        with self._lock:
            handle = self._unclaimed.get(id(array))
            if handle is None or self._writer.owns(array) != tuple(handle):
                return None
            del self._unclaimed[id(array)]
        return handle

    def _collected(self, key: int) -> None:
        with self._lock:
            handle = self._unclaimed.pop(key, None)
        if handle is not None:
            self._writer.free(handle)


def install(writer: ArenaWriter) -> OutputBuffers:
    """Serve `pb_utils.new_output_array` from this stub's s2p arena."""
    from pystub_backend.stub.pb_utils import _runtime
    global _installed
    _installed = OutputBuffers(writer)
    _runtime.set_output_allocator(_installed.allocate)
    return _installed


def claim(array: Any) -> Handle | None:
    return _installed.claim(array) if _installed is not None else None
