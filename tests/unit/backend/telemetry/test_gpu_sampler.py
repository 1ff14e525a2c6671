"""pystub_backend.backend.telemetry.gpu_metrics: what a scrape shows of the GPUs' readings."""

from __future__ import annotations

from pystub_backend.backend.telemetry.gpu_metrics import GpuSampler
from pystub_backend.backend.telemetry.prometheus_text import TextWriter
from pystub_backend.devices import DeviceError, GpuInfo, GpuReading, NoDevices


class _Board:
    """Two GPUs: the first has no power sensor and a rising energy counter, the second fails once read."""

    def __init__(self) -> None:
        self.energy = 500.0
        self.broken = False

    def gpus(self) -> list[GpuInfo]:
        return [GpuInfo(0, "GPU-a", "A"), GpuInfo(1, "GPU-b", "B")]

    def reading(self, device_id: int) -> GpuReading:
        if device_id == 1 and self.broken:
            raise DeviceError("GPU is lost")
        return GpuReading(utilization=0.5, memory_total_bytes=10, memory_used_bytes=4, energy_joules=self.energy,
                          power_watts=None if device_id == 0 else 50.0)

    def process_memory(self) -> dict[int, dict[int, int]]:
        return {101: {0: 5 << 20, 1: 1 << 20}, 102: {1: 3 << 20}}

    def close(self) -> None:
        return None


def _text(sampler: GpuSampler) -> list[str]:
    writer = TextWriter()
    sampler.write(writer)
    return [line for line in writer.text().splitlines() if not line.startswith("#")]


def test_values_by_uuid_energy_from_the_first_sample_and_a_lost_gpu_keeps_its_last_reading() -> None:
    board = _Board()
    sampler = GpuSampler(board)
    assert _text(sampler) == []  # nothing read yet
    sampler.sample()
    board.energy, board.broken = 530.0, True
    sampler.sample()
    lines = _text(sampler)
    assert 'nv_gpu_utilization{gpu_uuid="GPU-a"} 0.5' in lines
    assert 'nv_gpu_power_usage{gpu_uuid="GPU-b"} 50' in lines
    assert not any(line.startswith('nv_gpu_power_usage{gpu_uuid="GPU-a"}') for line in lines)  # no sensor
    assert 'nv_energy_consumption{gpu_uuid="GPU-a"} 30' in lines
    assert 'nv_energy_consumption{gpu_uuid="GPU-b"} 0' in lines  # its last reading, from before it was lost


def test_no_gpu_no_family() -> None:
    sampler = GpuSampler(NoDevices())
    sampler.sample()
    assert not sampler.active
    writer = TextWriter()
    sampler.write(writer)
    assert writer.text() == ""


def test_each_stubs_memory_on_each_gpu_by_uuid() -> None:
    sampler = GpuSampler(_Board())
    sampler.sample()
    writer = TextWriter()
    sampler.write_stub_memory(writer, [([("model", "m"), ("instance", "m_0")], 101),
                                       ([("model", "n"), ("instance", "n_0")], 999)])  # 999: holds none
    lines = [line for line in writer.text().splitlines() if not line.startswith("#")]
    assert lines == ['pystub_stub_gpu_memory_bytes{gpu_uuid="GPU-a",instance="m_0",model="m"} 5242880',
                     'pystub_stub_gpu_memory_bytes{gpu_uuid="GPU-b",instance="m_0",model="m"} 1048576']
