"""The fake device's memory: "device" allocations that cross processes the way CUDA IPC does.

An allocation is a memfd (anonymous, never in /dev/shm) mapped into the allocating process; its
"device pointer" is the mapping's host address, so copies are plain memmoves and a test model can
write into it. Its IPC handle names the memfd through the exporting process's fd table:

    handle (64 bytes) = b"PYSTUBFK" | pid u32 | fd u32 | size u64 | device u32 | token 16 bytes | zeros
                        open: /proc/<pid>/fd/<fd>, checked to be the memfd "pystub-fake-<token>"

This keeps CUDA's lifetime rules honest across real processes:

- an importer maps the very same pages (a write on one side is seen on the other);
- an importer holds a shared `flock` on the memfd while it maps it, so an exporter that frees an
  allocation some process still maps is caught (`free` raises, a collected one is counted in
  `freed_while_mapped()`), and the kernel drops the lock of an importer that dies;
- once the exporter freed it or exited, its fd is gone and opening the handle fails, as
  cudaIpcOpenMemHandle does.

Imported only under PYSTUB_FAKE_GPUS (tests); a deployment never loads it.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import struct
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from pystub_backend.devices.interface import IPC_HANDLE_SIZE, DeviceError, host_address

__all__ = ["FakeMemory", "fake_device_array", "freed_while_mapped"]

_HANDLE = struct.Struct("<8sIIQI16s")
_MAGIC = b"PYSTUBFK"
_NAME = "pystub-fake-"
_OPEN_FAILED = "cudaIpcOpenMemHandle failed: invalid argument"


@dataclass
class _Allocation:
    device_id: int
    fd: int
    size: int
    token: bytes
    mapping: mmap.mmap
    address: int


# Process-wide, as a CUDA context's allocations are: a model's tensors and the stub's bookkeeping
# see the same table whichever FakeMemory object they hold.
_lock = threading.Lock()
_allocations: dict[int, _Allocation] = {}  # by address
_mappings: dict[int, tuple[int, int, mmap.mmap]] = {}  # address -> (device, fd, mapping) of opened handles
_freed_while_mapped = 0


def _address_of(mapping: mmap.mmap) -> int:
    view = np.frombuffer(mapping, dtype=np.uint8)
    address = int(view.ctypes.data)
    del view  # no buffer export may outlive this, or the mapping could not be closed
    return address


def _allocate(device_id: int, byte_size: int) -> _Allocation:
    token = os.urandom(16)
    size = max(byte_size, 1)
    fd = os.memfd_create(_NAME + token.hex(), os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        mapping = mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise
    allocation = _Allocation(device_id, fd, size, token, mapping, _address_of(mapping))
    with _lock:
        _allocations[allocation.address] = allocation
    return allocation


def _mapped_elsewhere(allocation: _Allocation) -> bool:
    try:
        fcntl.flock(allocation.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(allocation.fd, fcntl.LOCK_UN)
    return False


def _release(allocation: _Allocation) -> None:
    allocation.mapping.close()
    os.close(allocation.fd)


def _free_collected(address: int) -> None:
    """The owner of a `fake_device_array` was collected: free it (a finalizer cannot raise)."""
    global _freed_while_mapped
    with _lock:
        allocation = _allocations.pop(address, None)
    if allocation is None:
        return
    if _mapped_elsewhere(allocation):
        _freed_while_mapped += 1
    _release(allocation)


def freed_while_mapped() -> int:
    """How many collected fake allocations were still mapped by another process (a lifetime bug)."""
    return _freed_while_mapped


def _containing(pointer: int) -> _Allocation | None:
    with _lock:
        for allocation in _allocations.values():
            if allocation.address <= pointer < allocation.address + allocation.size:
                return allocation
    return None


class FakeMemory:
    """DeviceMemory of the fake device (see the module docstring). `live()` counts what this process
    still has allocated and mapped, for leak checks."""

    def alloc(self, device_id: int, byte_size: int) -> int:
        return _allocate(device_id, byte_size).address

    def free(self, device_id: int, pointer: int) -> None:
        with _lock:
            allocation = _allocations.get(pointer)
            if allocation is None or allocation.device_id != device_id:
                raise DeviceError(f"cudaFree failed: invalid device pointer {pointer:#x} on device {device_id}")
            if _mapped_elsewhere(allocation):
                raise DeviceError(f"cudaFree of {pointer:#x} while another process maps it")
            del _allocations[pointer]
        _release(allocation)

    def to_host(self, device_id: int, pointer: int, destination: memoryview) -> None:
        if destination.nbytes:
            ctypes.memmove(host_address(destination), pointer, destination.nbytes)

    def from_host(self, device_id: int, pointer: int, source: memoryview) -> None:
        if source.nbytes:
            ctypes.memmove(pointer, host_address(source), source.nbytes)

    def device_copy(self, device_id: int, destination: int, source: int, nbytes: int) -> None:
        if nbytes:
            ctypes.memmove(destination, source, nbytes)

    def export_handle(self, device_id: int, pointer: int) -> tuple[bytes, int]:
        allocation = _containing(pointer)
        if allocation is None or allocation.device_id != device_id:
            raise DeviceError(f"cudaIpcGetMemHandle failed: invalid device pointer {pointer:#x} on device {device_id}")
        handle = _HANDLE.pack(_MAGIC, os.getpid(), allocation.fd, allocation.size, device_id, allocation.token)
        return handle.ljust(IPC_HANDLE_SIZE, b"\0"), pointer - allocation.address

    def open_handle(self, device_id: int, handle: bytes) -> int:
        if len(handle) != IPC_HANDLE_SIZE or not handle.startswith(_MAGIC):
            raise DeviceError(f"{_OPEN_FAILED} (not an IPC memory handle)")
        _, pid, fd, size, exported_on, token = _HANDLE.unpack_from(handle)
        if exported_on != device_id:
            raise DeviceError(f"{_OPEN_FAILED} (the memory is on device {exported_on}, not {device_id})")
        path = f"/proc/{pid}/fd/{fd}"
        try:  # the exporter's fd: gone once it freed the allocation or exited
            if not os.readlink(path).startswith(f"/memfd:{_NAME}{token.hex()}"):
                raise FileNotFoundError(path)
            own = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            raise DeviceError(f"{_OPEN_FAILED} (the exporting process freed the memory or exited)") from None
        try:
            fcntl.flock(own, fcntl.LOCK_SH)  # held while mapped: the exporter's free sees it
            mapping = mmap.mmap(own, size)
        except BaseException:
            os.close(own)
            raise
        address = _address_of(mapping)
        with _lock:
            _mappings[address] = (device_id, own, mapping)
        return address

    def close_handle(self, device_id: int, pointer: int) -> None:
        with _lock:
            entry = _mappings.pop(pointer, None)
        if entry is None:
            raise DeviceError(f"cudaIpcCloseMemHandle failed: {pointer:#x} is not mapped")
        _, fd, mapping = entry
        mapping.close()
        os.close(fd)  # drops the shared lock

    def live(self) -> tuple[int, int]:
        """(allocations, mappings) still open in this process."""
        with _lock:
            return len(_allocations), len(_mappings)


class _Owner:
    """Owns one allocation's memory for numpy: every view's base chain ends here, and its
    collection frees the allocation (no buffer export pins the mapping)."""

    __slots__ = ("__array_interface__", "__weakref__")

    def __init__(self, allocation: _Allocation, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.__array_interface__ = {"shape": shape, "typestr": dtype.str, "data": (allocation.address, False),
                                    "version": 3}


def fake_device_array(array: np.ndarray, device_id: int) -> np.ndarray:
    """A copy of `array` in a new fake allocation on `device_id`, as a writable numpy array over it:
    what `fake_cuda_capsule` of it exports can cross processes by IPC handle. The allocation is
    freed when the returned array (and every view of it) is collected."""
    source = np.ascontiguousarray(array)
    allocation = _allocate(device_id, source.nbytes)
    owner = _Owner(allocation, source.dtype, source.shape)
    weakref.finalize(owner, _free_collected, allocation.address).atexit = False
    device = np.asarray(owner)
    device[...] = source
    return device
