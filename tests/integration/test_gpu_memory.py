"""Each stub's GPU memory, and instances pinned to their GPU, on the fake two-GPU machine: NVML's
per-process figures (the stand-in counts each process's fake context and allocations) reach
`/v2/pystub/stubs`, `stubctl` and the `pystub_stub_gpu_memory_bytes` metric; a restarted or
unloaded instance's memory is back on the device. By default a model that allocates on "cuda"
lands on GPU 0 whatever its instance's GPU (as under Triton); with `PYSTUB_PIN_GPU: "yes"` the stub
sees only its own GPU, so "cuda" is the instance's GPU and no context is made on another."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests
from harness import ROOT, Backend
from prometheus_client.parser import text_string_to_metric_families

from pystub_backend.devices import FAKE_VARIABLE
from pystub_backend.devices.fake_engine import CONTEXT_BYTES, fake_uuid

_MIB = 1 << 20
# Holds 8 MiB on the CUDA device its process calls "cuda" (ordinal 0), as `torch.zeros(..., device="cuda")`
# would, and reports what initialize saw.
_MODEL = '''
import json, os
import numpy as np
import triton_python_backend_utils as pb_utils
from pystub_backend.devices import fake_device_array

class TritonPythonModel:
    def initialize(self, args):
        self.held = fake_device_array(np.zeros(2 << 20, np.float32), 0)  # "cuda": the current device
        self.seen = {"device_id": args["model_instance_device_id"],
                     "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def execute(self, requests):
        info = np.array([json.dumps(self.seen).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("INFO", info)]) for _ in requests]
'''
_PINNED = 'parameters { key: "PYSTUB_PIN_GPU" value { string_value: "yes" } }'


def _repository(root: Path) -> Path:
    for name, parameters in (("shared", ""), ("pinned", _PINNED)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(_MODEL)
        (root / name / "config.pbtxt").write_text(
            f'backend: "python"\nmax_batch_size: 0\n'
            f'output [ {{ name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }} ]\n'
            f'instance_group [ {{ kind: KIND_GPU count: 1 gpus: [ 1 ] }} ]\n{parameters}\n')
    return root


def _rows(backend: Backend) -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/pystub/stubs", timeout=30) as answer:
        return {row["model"]: row for row in json.loads(answer.read())["stubs"]}


def _seen(backend: Backend, model: str) -> dict[str, Any]:
    body = json.dumps({"inputs": []}).encode()
    request = urllib.request.Request(f"http://{backend.http_url}/v2/models/{model}/infer", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(json.loads(answer.read())["outputs"][0]["data"][0])


def _until(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.1)


def _memory_metric(backend: Backend) -> dict[tuple[str, str], float]:
    text = requests.get(backend.metrics_url, timeout=30).text
    return {(s.labels["model"], s.labels["gpu_uuid"]): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "pystub_stub_gpu_memory_bytes"}


def _device_used(backend: Backend, physical: int) -> float:
    text = requests.get(backend.metrics_url, timeout=30).text
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "nv_gpu_memory_used_bytes" and s.labels["gpu_uuid"] == fake_uuid(physical))


def test_each_stubs_gpu_memory_and_where_cuda_lands_pinned_or_not(tmp_path: Path) -> None:
    root = _repository(tmp_path)
    held = 8 * _MIB + CONTEXT_BYTES
    with Backend(root, "--metrics-interval-ms=100", "--model-control-mode=explicit", "--load-model=shared",
                 "--load-model=pinned", env={FAKE_VARIABLE: "2"}) as backend:
        rows = _rows(backend)
        # Not pinned: "cuda" is GPU 0 in the stub, whatever the instance's GPU (1); the stub sees both.
        assert _seen(backend, "shared") == {"device_id": "1", "visible": None}
        assert rows["shared"]["gpu_memory_by_device"] == {"0": held} and rows["shared"]["device_id"] == 1
        # Pinned: the stub sees GPU 1 alone, as its cuda:0; nothing lands on GPU 0.
        assert _seen(backend, "pinned") == {"device_id": "0", "visible": "1"}
        assert rows["pinned"]["gpu_memory_by_device"] == {"1": held} and rows["pinned"]["device_id"] == 1
        assert rows["pinned"]["gpu_memory_bytes"] == held
        metric = _until("the per-stub GPU memory metric", lambda: _memory_metric(backend))
        assert metric == {("shared", fake_uuid(0)): held, ("pinned", fake_uuid(1)): held}
        table = subprocess.run([sys.executable, str(ROOT / "tools" / "stubctl"), "--url", backend.http_url],
                               capture_output=True, text=True, timeout=60, check=True).stdout
        assert "GPU_MB" in table.splitlines()[0] and f"1:{held / _MIB:.1f}" in table
        # A restarted instance's memory goes with its old process; an unloaded one's with it.
        before = _device_used(backend, 1)
        old_pid = rows["pinned"]["pid"]
        restart = urllib.request.Request(f"http://{backend.http_url}/v2/pystub/stubs/pinned/restart", data=b"",
                                         method="POST")
        urllib.request.urlopen(restart, timeout=120).close()
        after = _rows(backend)["pinned"]
        assert after["pid"] != old_pid and after["gpu_memory_by_device"] == {"1": held}
        assert _until("GPU 1's used memory as before the restart", lambda: _device_used(backend, 1) == before)
        unload = urllib.request.Request(f"http://{backend.http_url}/v2/repository/models/pinned/unload", data=b"",
                                        method="POST")
        urllib.request.urlopen(unload, timeout=120).close()
        assert _until("GPU 1's memory back after the unload", lambda: _device_used(backend, 1) == before - held)
