"""Triton's GPU metrics on a real backend: on a fake two-GPU machine (PYSTUB_FAKE_GPUS=2) every
family appears with one series per visible GPU labelled by its UUID and the values of that GPU;
--allow-gpu-metrics=false and this machine's real lack of a GPU export none, without an error."""

from __future__ import annotations

import time
from pathlib import Path

import requests
from harness import Backend
from prometheus_client.parser import text_string_to_metric_families

from pystub_backend.devices import FAKE_VARIABLE
from pystub_backend.devices.fake import fake_uuid

_GIB = 1 << 30
_GPU_FAMILIES = {"nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes", "nv_gpu_power_usage",
                 "nv_gpu_power_limit", "nv_energy_consumption"}
_DEADLINE_S = 30.0


def _samples(backend: Backend) -> dict[tuple[str, str], float]:
    text = requests.get(backend.metrics_url, timeout=30).text
    return {(sample.name, sample.labels.get("gpu_uuid", "")): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if family.name in _GPU_FAMILIES or family.name.startswith("nv_gpu")}


def _sampled(backend: Backend) -> dict[tuple[str, str], float]:
    """The GPU samples once the poller has read the GPUs (its first sample follows start-up)."""
    deadline = time.monotonic() + _DEADLINE_S
    while time.monotonic() < deadline:
        found = _samples(backend)
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"no GPU metric within {_DEADLINE_S} s of scraping")


def _after_one_sample(backend: Backend) -> None:
    """Wait until the poller has taken a sample (it reads the machine's memory with the GPUs)."""
    deadline = time.monotonic() + _DEADLINE_S
    while time.monotonic() < deadline:
        text = requests.get(backend.metrics_url, timeout=30).text
        memory = [s.value for f in text_string_to_metric_families(text) for s in f.samples
                  if s.name == "nv_cpu_memory_total_bytes"]
        if memory and memory[0] > 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"the metrics poller took no sample within {_DEADLINE_S} s")


def test_gpu_families_carry_each_visible_gpus_values_by_uuid(tmp_path: Path) -> None:
    env = {FAKE_VARIABLE: "3", "CUDA_VISIBLE_DEVICES": "2,0"}
    with Backend(tmp_path, "--metrics-interval-ms=100", env=env) as backend:
        found = _sampled(backend)
    uuids = {fake_uuid(2), fake_uuid(0)}  # the visible ones, not physical GPU 1
    assert {uuid for _, uuid in found} == uuids
    assert {name for name, _ in found} == {*(_GPU_FAMILIES - {"nv_energy_consumption"}), "nv_energy_consumption_total"}
    assert found[("nv_gpu_memory_total_bytes", fake_uuid(2))] == 48 * _GIB  # physical 2: 16 GiB x 3
    assert found[("nv_gpu_memory_used_bytes", fake_uuid(0))] == _GIB
    assert found[("nv_gpu_utilization", fake_uuid(0))] == 0.25
    assert found[("nv_gpu_power_usage", fake_uuid(2))] == 102.0
    assert found[("nv_gpu_power_limit", fake_uuid(0))] == 300.0
    assert found[("nv_energy_consumption_total", fake_uuid(2))] == 0.0  # counted from the server's start


def test_no_gpu_metrics_when_turned_off(tmp_path: Path) -> None:
    with Backend(tmp_path, "--metrics-interval-ms=100", "--allow-gpu-metrics=false", env={FAKE_VARIABLE: "2"}) as off:
        _after_one_sample(off)
        assert _samples(off) == {}


def test_no_gpu_metrics_and_no_error_on_a_machine_without_a_gpu(tmp_path: Path) -> None:
    with Backend(tmp_path, "--metrics-interval-ms=100", "--log-verbose=1") as backend:
        _after_one_sample(backend)
        assert _samples(backend) == {}
        log = backend.log()
    assert "GPU" not in log and "Traceback" not in log and "nvml" not in log.lower()
