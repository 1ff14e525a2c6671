"""A fake GPU machine for tests of the CPU-side logic: PYSTUB_FAKE_GPUS=<count>.

The fake has `count` physical GPUs with fixed UUIDs and readings that differ per device (so a test
can tell them apart by label), seen through the same CUDA_VISIBLE_DEVICES logic as real ones.
Its memory is host memory in this process: enough to test copies and the bookkeeping of
allocations and handles, not CUDA itself. It is selected only by the variable, which the tests set
on the processes they start; a deployment never sets it.
"""

from __future__ import annotations

from collections.abc import Mapping

from pystub_backend.devices.interface import IPC_HANDLE_SIZE, DeviceError, GpuInfo, GpuReading
from pystub_backend.devices.visible import visible_physical

__all__ = ["FAKE_VARIABLE", "FakeSystem", "FakeMemory", "fake_uuid"]

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
    """DeviceMemory in host bytearrays; handles are the allocation's id, padded to IPC_HANDLE_SIZE.
    `live()` names what is still allocated or mapped, for leak checks."""

    def __init__(self) -> None:
        self._buffers: dict[int, bytearray] = {}
        self._devices: dict[int, int] = {}
        self._mapped: dict[int, int] = {}  # mapped pointer -> allocation pointer
        self._next = 0x1000

    def alloc(self, device_id: int, byte_size: int) -> int:
        pointer, self._next = self._next, self._next + max(byte_size, 1) + 0x100
        self._buffers[pointer], self._devices[pointer] = bytearray(byte_size), device_id
        return pointer

    def free(self, device_id: int, pointer: int) -> None:
        self._owned(device_id, pointer)
        del self._buffers[pointer], self._devices[pointer]

    def to_host(self, device_id: int, pointer: int, destination: memoryview) -> None:
        source = self._buffer(device_id, pointer)
        destination.cast("B")[:] = source[:len(destination)]

    def from_host(self, device_id: int, pointer: int, source: memoryview) -> None:
        target = self._buffer(device_id, pointer)
        target[:len(source)] = source.cast("B")

    def export_handle(self, device_id: int, pointer: int) -> bytes:
        self._owned(device_id, pointer)
        return pointer.to_bytes(8, "little").ljust(IPC_HANDLE_SIZE, b"\0")

    def open_handle(self, device_id: int, handle: bytes) -> int:
        pointer = int.from_bytes(handle[:8], "little")
        self._owned(device_id, pointer)
        mapped, self._next = self._next, self._next + 0x100
        self._mapped[mapped] = pointer
        return mapped

    def close_handle(self, device_id: int, pointer: int) -> None:
        if pointer not in self._mapped:
            raise DeviceError(f"cudaIpcCloseMemHandle failed: {pointer:#x} is not mapped")
        del self._mapped[pointer]

    def live(self) -> tuple[int, int]:
        """(allocations, mappings) still open."""
        return len(self._buffers), len(self._mapped)

    def _buffer(self, device_id: int, pointer: int) -> bytearray:
        pointer = self._mapped.get(pointer, pointer)
        self._owned(device_id, pointer)
        return self._buffers[pointer]

    def _owned(self, device_id: int, pointer: int) -> None:
        if self._devices.get(pointer) != device_id:
            raise DeviceError(f"invalid device pointer {pointer:#x} on device {device_id}")
