"""A fake GPU machine for tests of the CPU-side logic: PYSTUB_FAKE_GPUS=<count>.

The fake has `count` physical GPUs with fixed UUIDs and readings that differ per device (so a test
can tell them apart by label), seen through the same CUDA_VISIBLE_DEVICES logic as real ones.
Its memory (fake_memory.py) is memfd-backed host memory whose IPC handles cross real processes,
so copies, exports, imports and their lifetimes are tested, not CUDA itself. It is selected only
by the variable, which the tests set on the processes they start; a deployment never sets it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping

import numpy as np

from pystub_backend.devices.fake_memory import FakeMemory, fake_device_array
from pystub_backend.devices.interface import DeviceError, GpuInfo, GpuReading
from pystub_backend.devices.visible import visible_physical

__all__ = ["FAKE_VARIABLE", "FakeSystem", "FakeMemory", "fake_uuid", "fake_cuda_capsule", "fake_device_array"]

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
