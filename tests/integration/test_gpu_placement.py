"""GPU placement end to end on a fake two-GPU machine (PYSTUB_FAKE_GPUS=2): a real backend starts
one stub per instance and device, each model's `initialize` sees Triton's kind, name and device
id, and `/v2/pystub/stubs` and `stubctl` show the device. The GPU-less load failures are compared
with Triton in tests/differential/test_placement.py."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

from harness import ROOT, Backend

from pystub_backend.devices import FAKE_VARIABLE

_MODEL = '''
import json, os
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def initialize(self, args):
        keys = ("model_instance_kind", "model_instance_name", "model_instance_device_id")
        with open(os.path.join(args["model_repository"], "placed.jsonl"), "a") as out:
            out.write(json.dumps([args[key] for key in keys]) + "\\n")
    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
'''
_GROUPS = {
    "on_listed": "{ kind: KIND_GPU count: 2 gpus: [1, 0] }",
    "on_every": "{ kind: KIND_GPU }",
    "auto": "{ kind: KIND_AUTO }",
    "cpu": "{ kind: KIND_CPU count: 2 }",
}


def _repository(root: Path, groups: dict[str, str]) -> Path:
    for name, group in groups.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(_MODEL)
        (root / name / "config.pbtxt").write_text(
            f'backend: "python"\ninput [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]\n'
            f'output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]\ninstance_group [ {group} ]\n')
    return root


def _placed(root: Path, model: str) -> list[tuple[str, str, str]]:
    lines = (root / model / "placed.jsonl").read_text().splitlines()
    return sorted(tuple(json.loads(line)) for line in lines)  # type: ignore[misc]


def _get(backend: Backend, path: str, method: str = "GET") -> object:
    request = urllib.request.Request(f"http://{backend.http_url}{path}", method=method)
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_instances_run_on_the_devices_triton_would_choose(tmp_path: Path) -> None:
    root = _repository(tmp_path, _GROUPS)
    with Backend(root, env={FAKE_VARIABLE: "2"}) as backend:
        rows = _get(backend, "/v2/pystub/stubs")["stubs"]  # type: ignore[index]
        config = _get(backend, "/v2/models/auto/config")
        table = subprocess.run([sys.executable, str(ROOT / "tools" / "stubctl"), "--url", backend.http_url],
                               capture_output=True, text=True, timeout=60, check=True).stdout
    assert _placed(root, "on_listed") == sorted([("GPU", f"on_listed_0_{n}", d) for n in "01" for d in "01"])
    assert _placed(root, "on_every") == [("GPU", "on_every_0_0", "0"), ("GPU", "on_every_0_0", "1")]
    assert _placed(root, "auto") == [("GPU", "auto_0_0", "0"), ("GPU", "auto_0_0", "1")]
    assert _placed(root, "cpu") == [("CPU", "cpu_0_0", "0"), ("CPU", "cpu_0_1", "0")]
    assert config["instance_group"][0]["kind"] == "KIND_GPU" and config["instance_group"][0]["gpus"] == [0, 1]  # type: ignore[index]
    listed = sorted((row["model"], row["instance"], row["kind"], row["device_id"]) for row in rows)  # type: ignore[index]
    assert ("on_listed", "on_listed_0_1", "GPU", 1) in listed and len(listed) == 4 + 2 + 2 + 2
    assert ("cpu", "cpu_0_0", "CPU", 0) in listed
    assert "DEVICE" in table.splitlines()[0] and "GPU 1" in table and "CPU" in table


def test_cuda_visible_devices_limits_and_renumbers_the_devices(tmp_path: Path) -> None:
    root = _repository(tmp_path, {"on_every": _GROUPS["on_every"]})
    with Backend(root, env={FAKE_VARIABLE: "2", "CUDA_VISIBLE_DEVICES": "1"}):
        pass
    assert _placed(root, "on_every") == [("GPU", "on_every_0_0", "0")]


def test_a_listed_device_that_is_not_visible_fails_the_load(tmp_path: Path) -> None:
    root = _repository(tmp_path, {"missing": "{ kind: KIND_GPU gpus: [2] }"})
    backend = Backend(root, "--exit-on-error=false", "--strict-readiness=false", env={FAKE_VARIABLE: "2"})
    with backend:
        index = _get(backend, "/v2/repository/index", "POST")
    assert index == [{"name": "missing", "version": "1", "state": "UNAVAILABLE",
                      "reason": "Invalid argument: instance group missing_0 of model missing specifies invalid or "
                                "unsupported gpu id 2. GPUs with at least the minimum required CUDA compute "
                                "compatibility of 6.000000 are: 0, 1"}]
    assert not (root / "missing" / "placed.jsonl").exists()
