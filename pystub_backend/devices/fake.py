"""A fake GPU machine for tests of the CPU-side logic: PYSTUB_FAKE_GPUS=<count>.

The fake has `count` physical GPUs with fixed UUIDs and readings that differ per device (so a test
can tell them apart by label), seen through the same CUDA_VISIBLE_DEVICES logic as real ones.
Its memory is host memory in this process: enough to test copies and the bookkeeping of
allocations and handles, not CUDA itself. It is selected only by the variable, which the tests set
on the processes they start; a deployment never sets it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping

import numpy as np

from pystub_backend.devices.interface import IPC_HANDLE_SIZE, DeviceError, GpuInfo, GpuReading, host_address
from pystub_backend.devices.visible import visible_physical

__all__ = ["FAKE_VARIABLE", "FakeSystem", "FakeMemory", "fake_uuid", "fake_cuda_capsule"]

FAKE_VARIABLE = "PYSTUB_FAKE_GPUS"
_GIB = 1 << 30


def fake_uuid(physical: int) -> str:
    return f"GPU-fa4e0000-0000-0000-0000-{physical:012d}"


class FakeSystem:
    """`count` fake GPUs, filtered and ordered by CUDA_VISIBLE_DEVICES as CUDA would."""

    def __init__(self, count: int, environ: Mapping[str, str]) -> None:
        uuids = [fake_uuid(index) for index in range(count)]
        self._physical = visible_physical(uuids, environ)
        self._infos = [GpuInfo(logical, uuids[index], "Fake GPU") for logical, index in enumerate(self._physical)]

    def gpus(self) -> list[GpuInfo]:
        return list(self._infos)

    def reading(self, device_id: int) -> GpuReading:
        if not 0 <= device_id < len(self._infos):
            raise DeviceError(f"no visible GPU {device_id}")
        physical = self._physical[device_id]
        return GpuReading(utilization=0.25 * (physical + 1) % 1.0, memory_total_bytes=16 * _GIB * (physical + 1),
                          memory_used_bytes=_GIB * (physical + 1), power_watts=100.0 + physical,
                          power_limit_watts=300.0 + physical, energy_joules=1000.0 * (physical + 1))

    def close(self) -> None:
        return None


class FakeMemory:
    """DeviceMemory in host memory: "device" pointers are host addresses, so a test model can hand
    out a host array as if it were on a GPU (`fake_cuda_capsule`) and the stub's copies move real
    bytes. Allocations, IPC handles and mappings are tracked as CUDA would check them;
    `live()` names what is still allocated or mapped, for leak checks."""

    def __init__(self) -> None:
        self._buffers: dict[int, tuple[int, ctypes.Array[ctypes.c_char]]] = {}  # pointer -> (device, memory)
        self._mapped: dict[int, int] = {}  # mapping id -> the allocation's pointer

    def alloc(self, device_id: int, byte_size: int) -> int:
        memory = ctypes.create_string_buffer(max(byte_size, 1))
        pointer = ctypes.addressof(memory)
        self._buffers[pointer] = (device_id, memory)
        return pointer

    def free(self, device_id: int, pointer: int) -> None:
        self._owned(device_id, pointer)
        if pointer in self._mapped.values():
            raise DeviceError(f"cudaFree of {pointer:#x} while another process maps it")
        del self._buffers[pointer]

    def to_host(self, device_id: int, pointer: int, destination: memoryview) -> None:
        if destination.nbytes:
            ctypes.memmove(host_address(destination), self._mapped.get(pointer, pointer), destination.nbytes)

    def from_host(self, device_id: int, pointer: int, source: memoryview) -> None:
        if source.nbytes:
            ctypes.memmove(self._mapped.get(pointer, pointer), host_address(source), source.nbytes)

    def export_handle(self, device_id: int, pointer: int) -> bytes:
        self._owned(device_id, pointer)
        return pointer.to_bytes(8, "little").ljust(IPC_HANDLE_SIZE, b"\0")

    def open_handle(self, device_id: int, handle: bytes) -> int:
        pointer = int.from_bytes(handle[:8], "little")
        self._owned(device_id, pointer)
        mapping = pointer + 0x1_0000_0000_0000 + len(self._mapped)  # another address, as a mapping has
        self._mapped[mapping] = pointer
        return mapping

    def close_handle(self, device_id: int, pointer: int) -> None:
        if self._mapped.pop(pointer, None) is None:
            raise DeviceError(f"cudaIpcCloseMemHandle failed: {pointer:#x} is not mapped")

    def live(self) -> tuple[int, int]:
        """(allocations, mappings) still open."""
        return len(self._buffers), len(self._mapped)

    def _owned(self, device_id: int, pointer: int) -> None:
        if self._buffers.get(pointer, (None,))[0] != device_id:
            raise DeviceError(f"invalid device pointer {pointer:#x} on device {device_id}")


_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_KDL_CUDA = 2
_DEVICE_OFFSET = 8  # DLManagedTensor.dl_tensor: void* data, then DLDevice {int32 type, int32 id}


def fake_cuda_capsule(array: np.ndarray, device_id: int) -> object:
    """A legacy DLPack capsule of `array` that says it lives on CUDA device `device_id`: what a
    model on the fake machine returns in place of a GPU tensor (its memory is the array's)."""
    capsule = array.__dlpack__()
    managed = _capsule_pointer(capsule, b"dltensor")
    ctypes.c_int32.from_address(managed + _DEVICE_OFFSET).value = _KDL_CUDA
    ctypes.c_int32.from_address(managed + _DEVICE_OFFSET + 4).value = device_id
    return capsule
