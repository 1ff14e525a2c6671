"""A client's registered shm region as the backend holds it: an fd, never a mapping, and the
inputs that live in it, read from that fd only when something needs their bytes.

The owner of a client's object may truncate, remove or replace it at any time. A read through a
mapping past the object's new end is SIGBUS, which Python cannot recover from: the whole server
would die. `Region.read` uses `os.preadv` on the fd kept since registration, so a
region that shrank gives a short read, which is an INVALID_ARG error for the one request that
named it. Validation needs only an input's size (known from `shared_memory_byte_size`) except for
BYTES, whose elements it parses: a plain input in a region is never read by the backend at all
(the stub maps it, pystub_backend.stub.features.client_shm).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import Buffer, Tensor, buffer_view
from pystub_backend.ipc import tensors
from pystub_backend.ipc.status import Status

if TYPE_CHECKING:
    from pystub_backend.backend.supervision.stub_process import StubProcess

__all__ = ["Region", "CudaRegion", "ShmTensor"]


def _invalid(text: str) -> ServerError:
    return ServerError(text, Status.INVALID_ARG)


class Region:
    """One registration: an fd of the client's object (never mapped here), and who still uses it.

    `holds` counts the requests (and their stub round trips) using the region; after `unregister`
    the fd stays open until it drops to 0. `stubs` are the stub incarnations that were sent its
    handles, so they can be told to drop their own mappings.
    """

    def __init__(self, name: str, key: str, offset: int, byte_size: int, generation: int, inode: int,
                 fd: int | None, retire: Callable[[Region], None]) -> None:
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self.generation = generation
        self.inode = inode
        self.registered = True
        self.holds = 0
        self.stubs: weakref.WeakSet[StubProcess] = weakref.WeakSet()
        self._fd: int | None = fd
        self._lock = threading.Lock()  # a read on a worker thread (cache hashing) vs. close()
        # a region dropped unclosed closes too
        self._close_fd = weakref.finalize(self, os.close, fd) if fd is not None else None
        self._retire = retire

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def handle(self, offset: int, nbytes: int) -> list[Any]:
        return tensors.region_handle(self.generation, self.offset + offset, nbytes, self.key, self.inode)

    def read(self, offset: int, nbytes: int) -> bytearray:
        """A copy of the `nbytes` bytes at `offset` of the region (the caller checked the bounds
        against the registered size). Raises ServerError(INVALID_ARG) when the object is now
        shorter (its owner truncated it) or the region is gone; never faults."""
        data = bytearray(nbytes)
        with self._lock:
            if self._fd is None:
                raise _invalid(f"shared memory region '{self.name}' was unregistered")
            done, view = 0, memoryview(data)
            while done < nbytes:
                try:
                    count = os.preadv(self._fd, [view[done:]], self.offset + offset + done)
                except OSError as exc:
                    raise _invalid(f"cannot read shared memory region '{self.name}': {exc.strerror}") from None
                if count == 0:  # end of file: the object shrank after it was registered
                    raise _invalid(f"shared memory region '{self.name}' (key '{self.key}') is shorter than its "
                                   f"registered {self.offset + self.byte_size} bytes: it was truncated")
                done += count
        return data

    def hold(self) -> None:
        self.holds += 1

    def release(self) -> None:
        self.holds -= 1
        if self.holds == 0 and not self.registered:
            self._retire(self)

    def unmap(self) -> None:
        """Close the fd (a later read raises ServerError). Idempotent."""
        with self._lock:
            self._fd = None
            if self._close_fd is not None:
                self._close_fd()  # once only


class CudaRegion(Region):
    """A client's CUDA shared memory region: its CUDA IPC handle, kept as bytes. The backend holds no
    CUDA context and never opens it; the stub that serves a request does, and reads or writes the
    device memory itself. Holding, retiring and the stubs to tell are a system region's."""

    def __init__(self, name: str, device_id: int, byte_size: int, ipc_handle: bytes, generation: int,
                 retire: Callable[[Region], None]) -> None:
        super().__init__(name, "", 0, byte_size, generation, 0, None, retire)
        self.device_id = device_id
        self.ipc_handle = ipc_handle

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def handle(self, offset: int, nbytes: int) -> list[Any]:
        return tensors.cuda_region_handle(self.generation, offset, nbytes, self.device_id, self.ipc_handle)

    def read(self, offset: int, nbytes: int) -> bytearray:
        raise _invalid(f"the data in CUDA shared memory region '{self.name}' are read only by the model's "
                       f"stub: a BYTES input, a cached model or an ensemble cannot take its inputs from it")


class ShmTensor(Tensor):
    """An input that lives in a client region. The stub maps `handle` itself; `data` are read from
    the region on first use here (BYTES validation, the response cache, an ensemble step) and
    kept. Reading raises ServerError(INVALID_ARG) when the region shrank, ValueError once the
    request's lease was released."""

    def __init__(self, tensor: Tensor, region: Region, offset: int, nbytes: int) -> None:
        # Not Tensor.__init__: `data` is a property here, read lazily.
        self.name, self.datatype, self.shape = tensor.name, tensor.datatype, tensor.shape
        self.parameters = tensor.parameters
        self.device = None  # Tensor's slots have no class defaults: every field is set here
        self.region: Region | None = region
        self.handle: list[Any] | None = region.handle(offset, nbytes)
        self._offset, self._nbytes = offset, nbytes
        self._data: Buffer | None = None
        self._released = False

    @property
    def data(self) -> Buffer:
        if self._released:
            raise ValueError(f"input '{self.name}' was released with its request's shared memory lease")
        if self._data is None:
            assert self.region is not None
            self._data = self.region.read(self._offset, self._nbytes)
        return self._data

    @data.setter
    def data(self, value: Buffer) -> None:
        self._data = value

    @property
    def nbytes(self) -> int:
        return self._nbytes if self._data is None else buffer_view(self._data).nbytes

    def release(self) -> None:
        self._released, self._data = True, None
