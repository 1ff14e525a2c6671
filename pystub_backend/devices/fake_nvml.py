"""A stand-in for `pynvml` (nvidia-ml-py) over the fake machine: the real `devices/nvml.py` runs on it.

It has the calls NvmlSystem makes, with nvidia-ml-py's names, values and errors (read from
nvidia-ml-py 13.615): handles by index, UUIDs and names, utilization, memory, power and energy,
MIG mode and MIG device handles, and the compute processes of a device with the memory each uses.
Readings differ per physical GPU (so a test can tell them apart by label):

    utilization 0.25 * (n + 1) mod 1    memory total 16 GiB * (n + 1)    power 100 + n W (limit 300 + n)
    memory used 1 GiB * (n + 1) + what the processes below use           energy 1000 * (n + 1) J

A process's memory on GPU n is what fake_engine gives it there (its allocations and its context:
memfds named after the process and the device, as it maps them), in the process tree of the
process that reads (the server and its stubs), as NVML would list them. MIG: PYSTUB_FAKE_MIG="n,..." puts those
physical GPUs in MIG mode with two MIG devices each ("MIG-fa4e...-n-0", "-1").
"""

from __future__ import annotations

import re
import types
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

from pystub_backend.devices import fake_engine as engine

__all__ = ["fake_nvml", "mig_uuid", "process_memory", "MIG_VARIABLE"]

MIG_VARIABLE = "PYSTUB_FAKE_MIG"
_GIB = 1 << 30
_MIG_DEVICES = 2
NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND = 2, 3, 6
_MEMFD = re.compile(rf"/memfd:{engine.MEMFD_PREFIX}(\d+)-(\d+)-")


def mig_uuid(physical: int, index: int) -> str:
    return f"MIG-fa4e0000-0000-0000-{physical:04d}-{index:012d}"


class NVMLError(Exception):
    """As nvidia-ml-py's: `.value` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass(frozen=True)
class _Handle:
    physical: int
    mig: int | None = None  # the MIG device's index on its GPU


class _Struct:
    """What nvidia-ml-py's structures look like to a caller: attributes."""

    def __init__(self, **values: object) -> None:
        self.__dict__.update(values)


def process_memory() -> dict[tuple[int, int], int]:
    """{(pid, physical device): bytes} of the fake device memory (allocations, context) that this
    process and its descendants mapped themselves, read from each one's /proc/<pid>/maps."""
    found: dict[tuple[int, int], int] = {}
    try:
        processes = [psutil.Process(), *psutil.Process().children(recursive=True)]
    except psutil.Error:
        return found
    for process in processes:
        try:
            with open(f"/proc/{process.pid}/maps") as maps:
                lines = maps.readlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split(maxsplit=5)
            match = _MEMFD.match(fields[5]) if len(fields) == 6 else None
            if match is None or int(match.group(1)) != process.pid:
                continue  # not fake device memory, or another process's allocation this one maps
            start, end = (int(part, 16) for part in fields[0].split("-"))
            key = (process.pid, int(match.group(2)))
            found[key] = found.get(key, 0) + end - start
    return found


def fake_nvml(environ: Mapping[str, str]) -> types.ModuleType:
    """A `pynvml`-shaped module over the fake machine of `environ` (PYSTUB_FAKE_GPUS, PYSTUB_FAKE_MIG)."""
    count = int(environ.get(engine.FAKE_VARIABLE) or 0)
    mig = {int(part) for part in environ.get(MIG_VARIABLE, "").split(",") if part.strip()}
    module = types.ModuleType("pynvml", "stand-in nvidia-ml-py over the fake machine")
    state = {"initialized": 0}

    def check(handle: _Handle | None = None) -> None:
        if not state["initialized"]:
            raise NVMLError(1)  # NVML_ERROR_UNINITIALIZED
        if handle is not None and not (isinstance(handle, _Handle) and 0 <= handle.physical < count):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    def init() -> None:
        state["initialized"] += 1

    def shutdown() -> None:
        check()
        state["initialized"] -= 1

    def device_count() -> int:
        check()
        return count

    def name(handle: _Handle) -> str:
        check(handle)
        return "Fake GPU"

    def by_index(index: int) -> _Handle:
        check()
        if not 0 <= index < count:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def uuid(handle: _Handle) -> str:
        check(handle)
        return engine.fake_uuid(handle.physical) if handle.mig is None else mig_uuid(handle.physical, handle.mig)

    def utilization(handle: _Handle) -> _Struct:
        check(handle)
        if handle.mig is not None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # as on MIG devices
        return _Struct(gpu=int(25 * (handle.physical + 1) % 100), memory=0)

    def memory(handle: _Handle) -> _Struct:
        check(handle)
        total = 16 * _GIB * (handle.physical + 1)
        used = _GIB * (handle.physical + 1) + sum(
            size for (_, device), size in process_memory().items() if device == handle.physical)
        return _Struct(total=total, used=used, free=total - used)

    def processes(handle: _Handle) -> list[_Struct]:
        check(handle)
        return [_Struct(pid=pid, usedGpuMemory=size, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
                for (pid, device), size in sorted(process_memory().items()) if device == handle.physical]

    def mig_mode(handle: _Handle) -> list[int]:
        check(handle)
        on = int(handle.physical in mig)
        return [on, on]

    def max_mig(handle: _Handle) -> int:
        check(handle)
        return _MIG_DEVICES if handle.physical in mig else 0

    def mig_handle(handle: _Handle, index: int) -> _Handle:
        check(handle)
        if handle.physical not in mig or not 0 <= index < _MIG_DEVICES:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return _Handle(handle.physical, index)

    def power(handle: _Handle) -> int:
        check(handle)
        return (100 + handle.physical) * 1000

    def power_limit(handle: _Handle) -> int:
        check(handle)
        return (300 + handle.physical) * 1000

    def energy(handle: _Handle) -> int:
        check(handle)
        return 1000 * 1000 * (handle.physical + 1)

    module.__dict__.update(
        NVMLError=NVMLError, NVML_ERROR_NOT_SUPPORTED=NVML_ERROR_NOT_SUPPORTED,
        NVML_ERROR_NOT_FOUND=NVML_ERROR_NOT_FOUND, NVML_DEVICE_MIG_ENABLE=1, nvmlInit=init, nvmlShutdown=shutdown,
        nvmlDeviceGetCount=device_count, nvmlDeviceGetHandleByIndex=by_index,
        nvmlDeviceGetUUID=uuid, nvmlDeviceGetName=name,
        nvmlDeviceGetUtilizationRates=utilization, nvmlDeviceGetMemoryInfo=memory,
        nvmlDeviceGetComputeRunningProcesses=processes, nvmlDeviceGetMigMode=mig_mode,
        nvmlDeviceGetMaxMigDeviceCount=max_mig, nvmlDeviceGetMigDeviceHandleByIndex=mig_handle,
        nvmlDeviceGetPowerUsage=power, nvmlDeviceGetEnforcedPowerLimit=power_limit,
        nvmlDeviceGetTotalEnergyConsumption=energy)
    return module
