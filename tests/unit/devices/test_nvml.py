"""NvmlSystem (devices/nvml.py), the parent's view of the GPUs, on a stand-in of nvidia-ml-py: the
visible devices in CUDA's order, their readings (None where a board cannot say), each process's
device memory as NVML counts it, and MIG devices named in CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pystub_backend.devices import discover
from pystub_backend.devices.fake_engine import FAKE_VARIABLE, fake_uuid
from pystub_backend.devices.fake_nvml import MIG_VARIABLE, fake_nvml, mig_uuid
from pystub_backend.devices.nvml import open_nvml
from pystub_backend.devices.visible import pinned_entry, visible_physical

_GIB = 1 << 30


def test_the_visible_gpus_and_their_readings() -> None:
    system = open_nvml({"CUDA_VISIBLE_DEVICES": "1"}, fake_nvml({FAKE_VARIABLE: "2"}))
    assert system is not None
    assert [(g.device_id, g.uuid, g.name) for g in system.gpus()] == [(0, fake_uuid(1), "Fake GPU")]
    reading = system.reading(0)
    assert (reading.utilization, reading.memory_total_bytes, reading.power_watts, reading.power_limit_watts,
            reading.energy_joules) == (0.5, 32 * _GIB, 101.0, 301.0, 2000.0)
    system.close()
    system.close()  # idempotent


_HOLDER = '''
import os, sys
os.environ["PYSTUB_FAKE_GPUS"] = "2"
from pystub_backend.devices import fake_memory
memory = fake_memory()
pointer = memory.alloc(1, 8 << 20)
print("ready", flush=True)
sys.stdin.readline()
memory.free(1, pointer)
'''


def test_each_processs_device_memory_as_nvml_counts_it() -> None:
    environ = {FAKE_VARIABLE: "2"}
    system = discover(environ)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        per_process = system.process_memory()
        assert per_process[holder.pid] == {1: (8 << 20) + (4 << 20)}  # its block and its context, on GPU 1 only
        used = system.reading(1).memory_used_bytes
        assert used is not None and used >= 2 * _GIB + (12 << 20)
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(timeout=60)
        holder.stdout.close()  # type: ignore[union-attr]
    assert holder.pid not in system.process_memory()  # gone with its process
    system.close()


def test_mig_devices_are_enumerated_and_named_by_their_uuids() -> None:
    machine = {FAKE_VARIABLE: "2", MIG_VARIABLE: "1"}
    system = open_nvml({"CUDA_VISIBLE_DEVICES": mig_uuid(1, 1)}, fake_nvml(machine))
    assert system is not None
    assert [g.uuid for g in system.gpus()] == [mig_uuid(1, 1)]  # a MIG entry no longer hides every GPU
    reading = system.reading(0)
    assert reading.utilization is None and reading.memory_total_bytes == 32 * _GIB  # NOT_SUPPORTED on MIG: None
    everything = open_nvml({}, fake_nvml(machine))
    assert everything is not None
    assert [g.uuid for g in everything.gpus()] == [fake_uuid(0), mig_uuid(1, 0), mig_uuid(1, 1)]
    system.close()
    everything.close()


@pytest.mark.parametrize(("value", "expected"), [
    ("MIG-fa4e0000-0000-0000-0001-000000000001", [2]),
    ("MIG-fa4e0000-0000-0000-0001-000000000000,0", [1, 0]),
    ("GPU-fa4e0000-0000-0000-0000-000000000000,MIG-nope", [0]),  # stops at an unknown entry, as CUDA
])
def test_cuda_visible_devices_with_mig_entries(value: str, expected: list[int]) -> None:
    uuids = [fake_uuid(0), mig_uuid(1, 0), mig_uuid(1, 1)]
    assert visible_physical(uuids, {"CUDA_VISIBLE_DEVICES": value}) == expected


def test_the_entry_that_pins_a_logical_device() -> None:
    assert pinned_entry({}, 1) == "1"
    assert pinned_entry({"CUDA_VISIBLE_DEVICES": " 3, GPU-ab ,0"}, 1) == "GPU-ab"
    with pytest.raises(ValueError, match="has no device 3"):
        pinned_entry({"CUDA_VISIBLE_DEVICES": "0,1"}, 3)


def test_without_nvidia_ml_py_there_is_no_gpu() -> None:
    assert os.environ.get(FAKE_VARIABLE) == "2"  # the fixture's fake machine is for the stub side only
    assert discover({}).gpus() == []
