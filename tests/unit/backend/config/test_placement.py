"""Placement as Triton does it (pystub_backend.backend.config.placement) and the GPUs it places on
(pystub_backend.devices: CUDA_VISIBLE_DEVICES, the fake machine, discovery without a GPU)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tritonclient.grpc import model_config_pb2

from pystub_backend.backend.config.model_config import normalize, parse_config_text
from pystub_backend.backend.config.placement import PlacementError, check_placement, placements
from pystub_backend.devices import FAKE_VARIABLE, NoDevices, discover, fake_system
from pystub_backend.devices.fake import fake_uuid
from pystub_backend.devices.nvml import NvmlSystem
from pystub_backend.devices.visible import visible_physical

_Group = model_config_pb2.ModelInstanceGroup


def _config(groups: str, gpus: tuple[int, ...]) -> model_config_pb2.ModelConfig:
    return normalize(parse_config_text(f"instance_group [ {groups} ]", "test"), "m", gpus)


def _where(groups: str, gpus: tuple[int, ...]) -> list[tuple[str, str, int]]:
    return [(p.name, p.kind, p.device_id) for p in placements(_config(groups, gpus))]


def test_gpu_group_runs_count_instances_on_each_listed_device_with_the_same_names() -> None:
    assert _where("{ kind: KIND_GPU count: 2 gpus: [1, 0] }", (0, 1)) == [
        ("m_0_0", "GPU", 1), ("m_0_0", "GPU", 0), ("m_0_1", "GPU", 1), ("m_0_1", "GPU", 0)]


def test_gpu_group_without_gpus_runs_on_every_device_and_lists_them() -> None:
    config = _config("{ kind: KIND_GPU }", (0, 1, 2))
    assert list(config.instance_group[0].gpus) == [0, 1, 2]
    assert _where("{ kind: KIND_GPU }", (0, 1, 2)) == [("m_0_0", "GPU", d) for d in (0, 1, 2)]


@pytest.mark.parametrize("gpus, kind, devices", [((), _Group.KIND_CPU, []), ((0, 1), _Group.KIND_GPU, [0, 1])])
def test_auto_is_gpu_when_there_is_one_else_cpu(gpus: tuple[int, ...], kind: int, devices: list[int]) -> None:
    group = _config("{ kind: KIND_AUTO count: 2 }", gpus).instance_group[0]
    assert (group.kind, list(group.gpus)) == (kind, devices)


def test_cpu_and_model_groups_report_device_zero() -> None:
    assert _where("{ kind: KIND_CPU count: 2 }, { kind: KIND_MODEL }", (0, 1)) == [
        ("m_0_0", "CPU", 0), ("m_0_1", "CPU", 0), ("m_1_0", "MODEL", 0)]


@pytest.mark.parametrize("groups, gpus, text", [
    ("{ kind: KIND_GPU }", (),
     "instance group m_0 of model m has kind KIND_GPU but no GPUs are available"),
    ("{ name: \"grp\" kind: KIND_GPU count: 2 }", (),
     "instance group grp of model m has kind KIND_GPU but no GPUs are available"),
    ("{ kind: KIND_GPU gpus: [0] }", (),
     "instance group m_0 of model m specifies invalid or unsupported gpu id 0. GPUs with at least the minimum "
     "required CUDA compute compatibility of 6.000000 are: "),
    ("{ kind: KIND_CPU }, { kind: KIND_GPU gpus: [0, 3] }", (0, 1),
     "instance group m_1 of model m specifies invalid or unsupported gpu id 3. GPUs with at least the minimum "
     "required CUDA compute compatibility of 6.000000 are: 0, 1"),
])
def test_a_gpu_group_no_gpu_can_serve_fails_with_tritons_text(groups: str, gpus: tuple[int, ...], text: str) -> None:
    with pytest.raises(PlacementError) as caught:
        check_placement(_config(groups, gpus), gpus)
    assert str(caught.value) == text


@pytest.mark.parametrize("variable, expected", [
    (None, [0, 1, 2]), ("", []), ("-1", []), ("2,0", [2, 0]), ("1,-1,0", [1]), ("0,0", [0]), ("7", []),
    (fake_uuid(2)[:12] + "," + "0", []),  # a prefix that matches every fake UUID is ambiguous
    (fake_uuid(2) + ",1", [2, 1]),
])
def test_cuda_visible_devices_as_cuda_reads_it(variable: str | None, expected: list[int]) -> None:
    environ = {} if variable is None else {"CUDA_VISIBLE_DEVICES": variable}
    assert visible_physical([fake_uuid(i) for i in range(3)], environ) == expected


def test_the_fake_machine_numbers_visible_devices_logically() -> None:
    system = fake_system({FAKE_VARIABLE: "3", "CUDA_VISIBLE_DEVICES": "2,0"})
    assert [(g.device_id, g.uuid) for g in system.gpus()] == [(0, fake_uuid(2)), (1, fake_uuid(0))]
    assert system.reading(0).memory_total_bytes == 3 * system.reading(1).memory_total_bytes
    assert isinstance(discover({FAKE_VARIABLE: "2"}), NvmlSystem)  # NVML's code, on the stand-in


def test_discovery_on_this_machine_without_a_gpu_finds_none() -> None:
    # No NVIDIA driver here: with or without the `gpu` extra, no GPU and no error.
    system = discover({})
    assert isinstance(system, NoDevices) and system.gpus() == []


def test_a_plain_import_loads_neither_cuda_nor_nvml() -> None:
    # (cuda-bindings installs a .pth hook that imports the empty `cuda` namespace in every
    # interpreter; its modules, cuda.bindings.* or cuda.cudart, are what must stay unloaded.)
    code = ("import sys, pystub_backend.backend.server, pystub_backend.backend.cli, pystub_backend.stub.stub, "
            "pystub_backend.stub.pb_utils, pystub_backend.devices\n"
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'pynvml' or m.startswith('cuda.'))\n"
            "print(loaded)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"
