"""Triton's GPU gauges on the metrics port, one series per visible GPU labelled `gpu_uuid`.

    nv_gpu_utilization          gauge    0.0 .. 1.0
    nv_gpu_memory_total_bytes   gauge
    nv_gpu_memory_used_bytes    gauge
    nv_gpu_power_usage          gauge    watts
    nv_gpu_power_limit          gauge    watts
    nv_energy_consumption       counter  joules since the server started

and, per stub, what NVML counts of its process on each GPU (its CUDA context and allocations):

    pystub_stub_gpu_memory_bytes {model, version, instance, gpu_uuid}   gauge

Sampled with the other polled gauges every --metrics-interval-ms (on the poller's worker thread:
NVML calls block), read at scrape time. No GPU, or --allow-gpu-metrics=false: no family at all.
A value a GPU cannot report (NVML_ERROR_NOT_SUPPORTED) is left out of its family.
"""

from __future__ import annotations

from collections.abc import Callable

from pystub_backend.backend.telemetry.prometheus_text import TextWriter
from pystub_backend.devices import DeviceError, DeviceSystem, GpuInfo, GpuReading

__all__ = ["GpuSampler", "GPU_FAMILIES", "STUB_GPU_MEMORY"]

_Value = Callable[[GpuReading], "float | int | None"]
GPU_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)"),
    ("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes"),
    ("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes"),
    ("nv_gpu_power_usage", "gauge", "GPU power usage in watts"),
    ("nv_gpu_power_limit", "gauge", "GPU power management limit in watts"),
    ("nv_energy_consumption", "counter", "GPU energy consumption in joules since the Triton Server started"),
)


STUB_GPU_MEMORY = ("pystub_stub_gpu_memory_bytes", "gauge",
                   "Device memory the stub's process holds on the GPU, as the driver counts it (its CUDA context "
                   "included), in bytes")


class GpuSampler:
    """The latest reading of every visible GPU and of each process's memory on them; energy counted
    from the first sample."""

    def __init__(self, devices: DeviceSystem) -> None:
        self._devices = devices
        self._gpus: list[GpuInfo] = devices.gpus()
        self._readings: dict[int, GpuReading] = {}
        self._energy_start: dict[int, float] = {}
        self.process_memory: dict[int, dict[int, int]] = {}  # pid -> {device id: bytes}

    @property
    def active(self) -> bool:
        return bool(self._gpus)

    def sample(self) -> None:
        """Read every GPU (blocking NVML calls: run off the event loop). A GPU that cannot be read
        keeps its last reading."""
        readings = dict(self._readings)
        for gpu in self._gpus:
            try:
                reading = self._devices.reading(gpu.device_id)
            except DeviceError:
                continue
            if reading.energy_joules is not None:
                self._energy_start.setdefault(gpu.device_id, reading.energy_joules)
            readings[gpu.device_id] = reading
        self._readings = readings  # one assignment: the loop's readers see a whole sample
        self.process_memory = self._devices.process_memory()

    def write(self, writer: TextWriter) -> None:
        if not self._gpus:
            return
        values: dict[str, _Value] = {
            "nv_gpu_utilization": lambda r: r.utilization,
            "nv_gpu_memory_total_bytes": lambda r: r.memory_total_bytes,
            "nv_gpu_memory_used_bytes": lambda r: r.memory_used_bytes,
            "nv_gpu_power_usage": lambda r: r.power_watts,
            "nv_gpu_power_limit": lambda r: r.power_limit_watts,
        }
        readings = self._readings
        for name, kind, help_text in GPU_FAMILIES:
            writer.family(name, kind, help_text)
            for gpu in self._gpus:
                reading = readings.get(gpu.device_id)
                value = None if reading is None else (
                    self._energy(gpu.device_id, reading) if name == "nv_energy_consumption" else values[name](reading))
                if value is not None:
                    writer.sample(name, [("gpu_uuid", gpu.uuid)], value)

    def _energy(self, device_id: int, reading: GpuReading) -> float | None:
        if reading.energy_joules is None:
            return None
        return reading.energy_joules - self._energy_start.get(device_id, reading.energy_joules)

    def write_stub_memory(self, writer: TextWriter, stubs: list[tuple[list[tuple[str, str]], int]]) -> None:
        """`pystub_stub_gpu_memory_bytes` of each (labels, pid) stub, one series per GPU it holds memory on."""
        if not self._gpus:
            return
        uuids = {gpu.device_id: gpu.uuid for gpu in self._gpus}
        name = STUB_GPU_MEMORY[0]
        writer.family(*STUB_GPU_MEMORY)
        memory = self.process_memory
        for labels, pid in stubs:
            for device_id, size in sorted(memory.get(pid, {}).items()):
                writer.sample(name, [*labels, ("gpu_uuid", uuids.get(device_id, str(device_id)))], size)
