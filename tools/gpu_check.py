#!/usr/bin/env python3
"""The device check: pystub on a real NVIDIA GPU, every answer compared with what it must be.

One script, for a bare GPU machine with Python 3.12, PyTorch (CUDA), cuda-bindings and nvidia-ml-py
but none of pystub's other dependencies and no package index (docs/gpu.md#the-device-check):

    python tools/fetch_gpu_wheels.py          # here, with network: the missing wheels into .whl/
    python3 tools/gpu_check.py                # there: installs .whl/ into a target folder, runs
    python tools/gpu_check.py --fake          # anywhere: the same check on pystub's fake GPU

It writes its models into a temporary repository (none of them synchronizes: each hands pystub
tensors whose kernels may still be queued, some after a 50 ms kernel), starts pystub on free
loopback ports and prints one `PASS` or `FAIL <reason>` line per case, never a traceback, then the
latency rows (GPU path beside the CPU path, measured in the same run). A server that does not
start is a FAIL line. The check keeps to `--budget-s` (default 450 s; startup included): a case
that would start past it is a FAIL saying so.

Exit status: 0 all passed, 1 a case failed, 2 the dependencies are missing, 3 no GPU (`SKIP`).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"
WHEELS = ROOT / ".whl"
SITE = Path(tempfile.gettempdir()) / "pystub-gpu-check-site"
sys.path.insert(0, str(ROOT))

NO_GPU_EXIT, MISSING_EXIT = 3, 2
_INSTALLED = "GPU_CHECK_INSTALLED"
_START_TIMEOUT_S = 240.0
_MIB = 1 << 20
# What pystub imports that the GPU machine's image lacks (tools/fetch_gpu_wheels.py carries them).
NEEDED = ("posix_ipc", "ngh2", "simdjson", "orjson", "rapidjson", "google.protobuf", "grpc", "grpc_health.v1",
          "grpc_reflection.v1alpha", "opentelemetry.proto", "tritonclient.grpc", "tritonclient.utils", "msgpack",
          "aiohttp", "psutil", "prometheus_client", "numpy")

# -- the models -----------------------------------------------------------------------------------
_CONFIG = """backend: "python"
max_batch_size: 0
{policy}
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ kind: {kind} count: {count}{gpus} }} ]
{parameters}"""
_GPU_INPUTS = 'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value { string_value: "no" } }'
_PINNED = 'parameters { key: "PYSTUB_PIN_GPU" value { string_value: "yes" } }'
_DECOUPLED = "model_transaction_policy { decoupled: true }"
# OUT = IN * 2 + 1 on the instance's GPU, handed over unsynchronized. Request parameters: "late"
# (a 50 ms kernel first), "side" (on a stream of the model's own, handed over as the tensor object
# inside the stream's `with`), "empty" (a 0-element output). The response parameters say where IN
# arrived, where OUT was computed and what the process sees.
_GPU_MODEL = """
import json, os
{prelude}
import triton_python_backend_utils as pb_utils
import gpu_check_kit


class TritonPythonModel:
    def initialize(self, args):
        self.kit = gpu_check_kit.load()
        self.device = int(args["model_instance_device_id"])
        hold = int(os.environ.get("GPU_CHECK_HOLD_BYTES", "0")) if "hold" in args["model_name"] else 0
        self.held = self.kit.hold(hold, self.device) if hold else None

    def execute(self, requests):
        responses = []
        for request in requests:
            p = json.loads(request.parameters() or "{{}}")
            given = pb_utils.get_input_tensor_by_name(request, "IN")
            x = self.kit.on_device(given, self.device)
            if p.get("empty"):
                y = self.kit.empty(self.device)
                out = self.kit.output("OUT", y)
            elif p.get("side"):
                with self.kit.side_stream(self.device):
                    self.kit.long_kernel(self.device)
                    y = self.kit.affine(x)
                    out = self.kit.output("OUT", y, as_object=True)
            else:
                if p.get("late"):
                    self.kit.long_kernel(self.device)
                y = self.kit.affine(x)
                out = self.kit.output("OUT", y)
            responses.append(pb_utils.InferenceResponse([out], parameters={{
                "input_on_gpu": not given.is_cpu(), "device": self.kit.device_of(y), "pid": os.getpid(),
                "devices": self.kit.device_count(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES", "")}}))
        return responses
"""
_EXPANDABLE = 'os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"  # not cudaMalloc blocks'
_CPU_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2 + 1)]) for r in requests]
"""
# BLS: calls `target` `rounds` times, each with the previous answer; parameters: "prefer_gpu" (the
# answers on GPU 0), "gpu_input" (each input first copied into a new GPU tensor here, handed over
# unsynchronized), "callee" (the callee's request parameters, JSON). It answers with the last
# answer (a mapped one is handed on as it is) and says whether all answers arrived on the GPU, all
# inputs reached the callee on the GPU, and how many mappings this stub held.
_BLS_MODEL = """
import json
import triton_python_backend_utils as pb_utils
import gpu_check_kit
from pystub_backend.stub.features import bls


class TritonPythonModel:
    def initialize(self, args):
        self.kit = gpu_check_kit.load()
        self.device = int(args["model_instance_device_id"])

    def execute(self, requests):
        responses = []
        for request in requests:
            p = json.loads(request.parameters() or "{}")
            tensor = pb_utils.get_input_tensor_by_name(request, "IN")
            on_gpu, inputs_on_gpu, mapped, keep = True, True, 0, []
            for _ in range(int(p.get("rounds", 1))):
                given = tensor
                if p.get("gpu_input"):
                    copy = self.kit.copy(self.kit.on_device(tensor, self.device))
                    keep.append(copy)
                    given = self.kit.output("IN", copy, as_object=True)
                kwargs = {}
                if p.get("prefer_gpu"):
                    kwargs["preferred_memory"] = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 0)
                answer = pb_utils.InferenceRequest(
                    model_name=p["target"], inputs=[pb_utils.Tensor.from_dlpack("IN", given.to_dlpack())],
                    requested_output_names=["OUT"], parameters=json.loads(p.get("callee", "{}")), **kwargs).exec()
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                tensor = pb_utils.get_output_tensor_by_name(answer, "OUT")
                on_gpu = on_gpu and not tensor.is_cpu()
                inputs_on_gpu = inputs_on_gpu and json.loads(answer.parameters() or "{}").get("input_on_gpu", False)
                mapped = max(mapped, bls.inspect()["device_mappings"])
            responses.append(pb_utils.InferenceResponse([tensor], parameters={
                "on_gpu": on_gpu, "inputs_on_gpu": inputs_on_gpu, "mapped": mapped}))
        return responses
"""
# An async decoupled model on GPU 0 that calls itself for an answer on GPU 0: its stub opens the
# handle it exported itself (CUDA refuses that in the exporting process).
_SELF_CALLER = """
import json
import triton_python_backend_utils as pb_utils
import gpu_check_kit


class TritonPythonModel:
    def initialize(self, args):
        self.kit = gpu_check_kit.load()

    async def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            given = pb_utils.get_input_tensor_by_name(request, "IN")
            if json.loads(request.parameters() or "{}").get("inner"):
                out = self.kit.output("OUT", self.kit.affine(self.kit.on_device(given, 0)))
            else:
                call = pb_utils.InferenceRequest(
                    model_name="self_caller", inputs=[given], requested_output_names=["OUT"],
                    parameters={"inner": True},
                    preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 0))
                answers = [a for a in await call.async_exec(decoupled=True) if a.output_tensors() or a.has_error()]
                if answers[0].has_error():
                    raise pb_utils.TritonModelException(answers[0].error().message())
                out = pb_utils.get_output_tensor_by_name(answers[0], "OUT")
                if out.is_cpu():
                    raise pb_utils.TritonModelException("the inner answer did not arrive on the GPU")
            sender.send(pb_utils.InferenceResponse([out]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
_SELF_DRIVER = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(model_name="self_caller", requested_output_names=["OUT"],
                                             inputs=[pb_utils.get_input_tensor_by_name(request, "IN")])
            answers = [a for a in call.exec(decoupled=True) if a.output_tensors() or a.has_error()]
            if answers[0].has_error():
                raise pb_utils.TritonModelException(answers[0].error().message())
            responses.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(answers[0], "OUT")]))
        return responses
"""
_ON_GPU_0 = " gpus: [ 0 ]"
# name: (code, kind, count, gpus, parameters, policy); loaded at start unless named in _LATER
MODELS: dict[str, tuple[str, str, int, str, str, str]] = {
    "torch_gpu": (_GPU_MODEL.format(prelude=""), "KIND_GPU", 1, "", "", ""),
    "torch_gpu_two": (_GPU_MODEL.format(prelude=""), "KIND_GPU", 2, "", "", ""),
    "torch_gpu_inputs": (_GPU_MODEL.format(prelude=""), "KIND_GPU", 1, _ON_GPU_0, _GPU_INPUTS, ""),
    "torch_expandable": (_GPU_MODEL.format(prelude=_EXPANDABLE), "KIND_GPU", 1, _ON_GPU_0, "", ""),
    "torch_pinned": (_GPU_MODEL.format(prelude=""), "KIND_GPU", 1, _ON_GPU_0, _PINNED, ""),
    "torch_hold": (_GPU_MODEL.format(prelude=""), "KIND_GPU", 1, _ON_GPU_0, "", ""),
    "numpy_cpu": (_CPU_MODEL, "KIND_CPU", 1, "", "", ""),
    "bls_gpu": (_BLS_MODEL, "KIND_GPU", 1, _ON_GPU_0, "", ""),
    "relay": (_BLS_MODEL, "KIND_GPU", 1, _ON_GPU_0, "", ""),
    "bls_cpu": (_BLS_MODEL, "KIND_CPU", 1, "", "", ""),
    "self_caller": (_SELF_CALLER, "KIND_GPU", 1, _ON_GPU_0, "", _DECOUPLED),
    "self_driver": (_SELF_DRIVER, "KIND_CPU", 1, "", "", ""),
}
_LATER = ("torch_hold",)  # loaded by its case


def write_repository(root: Path, only: tuple[str, ...] = ()) -> Path:
    """The check's models under `root` (all, or those named in `only`)."""
    for name, (code, kind, count, gpus, parameters, policy) in MODELS.items():
        if only and name not in only:
            continue
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(code)
        (root / name / "config.pbtxt").write_text(_CONFIG.format(kind=kind, count=count, gpus=gpus,
                                                                 parameters=parameters, policy=policy))
    return root


# -- pystub ---------------------------------------------------------------------------------------
class ServerStartError(Exception):
    """pystub did not become ready; the text says why (its log is kept)."""


def _free_ports(count: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


@contextlib.contextmanager
def running_pystub(repository: Path, log_path: Path, models: tuple[str, ...] = ()) -> Iterator[dict[str, int]]:
    """pystub on free loopback ports, ready, with `models` loaded (all when empty; explicit model
    control); stopped (SIGTERM, then SIGKILL) at the end. Raises ServerStartError."""
    http, grpc, metrics = _free_ports(3)
    names = models or tuple(sorted(p.name for p in repository.iterdir() if p.is_dir()))
    command = [sys.executable, "-m", "pystub_backend.backend", "--model-repository", str(repository),
               f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}", "--metrics-interval-ms=200",
               "--allow-client-shm=true", "--model-control-mode=explicit", *(f"--load-model={n}" for n in names)]
    path = os.pathsep.join(p for p in (str(ROOT), str(TOOLS), os.environ.get("PYTHONPATH")) if p)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=path),
                                   start_new_session=True)
    try:
        _wait_ready(process, http)
        yield {"http": http, "grpc": grpc, "metrics": metrics}
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _wait_ready(process: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerStartError(f"pystub exited with status {process.returncode} before it was ready")
        with contextlib.suppress(OSError), \
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as answer:
            if answer.status == 200:
                return
        time.sleep(0.2)
    raise ServerStartError(f"pystub not ready after {_START_TIMEOUT_S:.0f} s (waiting for /v2/health/ready)")


# -- clients --------------------------------------------------------------------------------------
def _request(ports: dict[str, int], path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
             port: str = "http") -> tuple[bytes, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{ports[port]}{path}", data=body, headers=headers or {},
                                     method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=300) as answer:
            return answer.read(), answer.headers
    except urllib.error.HTTPError as error:
        text = error.read().decode(errors="replace")
        with contextlib.suppress(ValueError):
            text = json.loads(text).get("error", text)
        raise AssertionError(f"{path} answered {error.code}: {text}") from None


def http_infer(ports: dict[str, int], model: str, data: Any, parameters: dict[str, Any] | None = None  # noqa: ANN401
               ) -> tuple[Any, dict[str, Any]]:
    """(OUT, response parameters) of one KServe v2 HTTP request with binary tensors."""
    import numpy as np

    header = {"inputs": [{"name": "IN", "shape": list(data.shape), "datatype": "FP32",
                          "parameters": {"binary_data_size": data.nbytes}}],
              "outputs": [{"name": "OUT", "parameters": {"binary_data": True}}], "parameters": parameters or {}}
    head = json.dumps(header).encode()
    body, headers = _request(ports, f"/v2/models/{model}/infer", head + data.tobytes(),
                             {"Inference-Header-Content-Length": str(len(head)),
                              "Content-Type": "application/octet-stream"})
    size = int(headers.get("Inference-Header-Content-Length", len(body)))
    document = json.loads(body[:size])
    (output,) = document["outputs"]
    nbytes = output.get("parameters", {}).get("binary_data_size", 0)
    array = np.frombuffer(body[size:size + nbytes], dtype=np.float32).reshape(output["shape"])
    return array, document.get("parameters", {})


def _grpc(ports: dict[str, int]) -> Any:  # noqa: ANN401 - a tritonclient.grpc client
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")


def _expected(data: Any, rounds: int = 1) -> Any:  # noqa: ANN401
    for _ in range(rounds):
        data = data * 2 + 1
    return data


def _same(result: Any, expected: Any) -> None:  # noqa: ANN401
    import numpy as np

    if result.shape != expected.shape:
        raise AssertionError(f"shape {list(result.shape)}, expected {list(expected.shape)}")
    if not np.allclose(result, expected, rtol=1e-6, atol=0):
        wrong = int(np.sum(~np.isclose(result, expected, rtol=1e-6, atol=0)))
        raise AssertionError(f"{wrong} of {expected.size} values wrong (e.g. {result.ravel()[:3].tolist()}, "
                             f"expected {expected.ravel()[:3].tolist()}): bytes read before they were written?")


def _rows(ports: dict[str, int]) -> dict[str, dict[str, Any]]:
    return {row["instance"] + "@" + str(row["device_id"]): row
            for row in json.loads(_request(ports, "/v2/pystub/stubs")[0])["stubs"]}


def _metric(ports: dict[str, int], name: str) -> dict[str, float]:
    lines = _request(ports, "/metrics", port="metrics")[0].decode().splitlines()
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in lines if line.startswith(name + "{")}


class Check:
    """The cases, against one running pystub."""

    def __init__(self, ports: dict[str, int], data: Any) -> None:  # noqa: ANN401
        self.ports, self.data = ports, data

    # -- a model's CUDA outputs ---------------------------------------------------------------------
    def http_late(self) -> None:
        out, facts = http_infer(self.ports, "torch_gpu", self.data, {"late": True})
        _same(out, _expected(self.data))
        if facts.get("input_on_gpu") is not False:
            raise AssertionError(f"IN should arrive on the CPU (FORCE_CPU_ONLY_INPUT_TENSORS), facts {facts}")

    def grpc_late(self) -> None:
        import tritonclient.grpc as grpcclient

        client = _grpc(self.ports)
        try:
            tensor = grpcclient.InferInput("IN", list(self.data.shape), "FP32")
            tensor.set_data_from_numpy(self.data)
            result = client.infer("torch_gpu", [tensor], parameters={"late": True}, client_timeout=300.0)
        finally:
            client.close()
        _same(result.as_numpy("OUT"), _expected(self.data))

    def side_stream(self) -> None:
        out, _ = http_infer(self.ports, "torch_gpu", self.data, {"side": True})
        _same(out, _expected(self.data))

    def empty_output(self) -> None:
        import numpy as np

        out, _ = http_infer(self.ports, "torch_gpu", self.data, {"empty": True})
        _same(out, np.empty(0, np.float32))
        bls, facts = http_infer(self.ports, "bls_gpu", self.data, {"target": "torch_gpu", "prefer_gpu": True,
                                                                    "callee": json.dumps({"empty": True})})
        _same(bls, np.empty(0, np.float32))
        if facts.get("on_gpu") is not True:
            raise AssertionError(f"the empty BLS answer should be a GPU tensor, facts {facts}")

    # -- client CUDA shared memory -------------------------------------------------------------------
    def _cuda_shm(self, model: str, parameters: dict[str, Any]) -> Any:  # noqa: ANN401
        import tritonclient.grpc as grpcclient
        import tritonclient.utils.cuda_shared_memory as cudashm

        nbytes = self.data.nbytes
        client = _grpc(self.ports)
        regions = [cudashm.create_shared_memory_region(name, nbytes, 0) for name in ("gc_in", "gc_out")]
        try:
            cudashm.set_shared_memory_region(regions[0], [self.data])
            for name, region in zip(("gc_in", "gc_out"), regions, strict=True):
                client.register_cuda_shared_memory(name, cudashm.get_raw_handle(region), 0, nbytes)
            tensor = grpcclient.InferInput("IN", list(self.data.shape), "FP32")
            tensor.set_shared_memory("gc_in", nbytes)
            output = grpcclient.InferRequestedOutput("OUT")
            output.set_shared_memory("gc_out", nbytes)
            client.infer(model, [tensor], outputs=[output], parameters=parameters, client_timeout=300.0)
            result = cudashm.get_contents_as_numpy(regions[1], self.data.dtype, self.data.shape)
        finally:
            _request(self.ports, "/v2/cudasharedmemory/unregister", b"")  # answers once the stubs closed
            for region in regions:
                cudashm.destroy_shared_memory_region(region)
            client.close()
        return result

    def cuda_shm_gpu_model(self) -> None:
        _same(self._cuda_shm("torch_gpu", {"late": True}), _expected(self.data))

    def cuda_shm_cpu_model(self) -> None:
        _same(self._cuda_shm("numpy_cpu", {}), _expected(self.data))

    # -- BLS -----------------------------------------------------------------------------------------
    def _bls(self, model: str, parameters: dict[str, Any], rounds: int = 2) -> dict[str, Any]:
        out, facts = http_infer(self.ports, model, self.data, {**parameters, "rounds": rounds})
        _same(out, _expected(self.data, rounds))
        return facts

    def bls_mapped(self) -> None:
        facts = self._bls("bls_gpu", {"target": "torch_gpu", "prefer_gpu": True, "callee": json.dumps({"late": True})})
        if facts.get("on_gpu") is not True or not facts.get("mapped"):
            raise AssertionError(f"the answers should arrive as GPU tensors mapped by CUDA IPC, facts {facts}")

    def bls_gpu_inputs(self) -> None:
        facts = self._bls("bls_gpu", {"target": "torch_gpu_inputs", "prefer_gpu": True, "gpu_input": True}, 1)
        if facts.get("inputs_on_gpu") is not True:
            raise AssertionError(f"the callee should get its BLS inputs on the GPU, facts {facts}")

    def bls_relay(self) -> None:
        callee = json.dumps({"target": "torch_gpu", "prefer_gpu": True, "callee": json.dumps({"late": True})})
        facts = self._bls("bls_gpu", {"target": "relay", "prefer_gpu": True, "callee": callee}, 1)
        if facts.get("on_gpu") is not True:
            raise AssertionError(f"the relayed answer (a tensor the relay mapped) should arrive on the GPU, {facts}")

    def bls_expandable(self) -> None:
        facts = self._bls("bls_gpu", {"target": "torch_expandable", "prefer_gpu": True,
                                      "callee": json.dumps({"late": True})}, 1)
        if facts.get("on_gpu") is not True:
            raise AssertionError(f"the answer should arrive on the GPU, facts {facts}")

    def own_export(self) -> None:
        out, _ = http_infer(self.ports, "self_driver", self.data)
        _same(out, _expected(self.data))

    # -- placement, memory, metrics -------------------------------------------------------------------
    def two_instances(self) -> None:
        for _ in range(4):
            out, _ = http_infer(self.ports, "torch_gpu_two", self.data)
            _same(out, _expected(self.data))
        placed = sorted((r["instance"], r["kind"], r["device_id"]) for r in _rows(self.ports).values()
                        if r["model"] == "torch_gpu_two")
        wanted = [(f"torch_gpu_two_0_{n}", "GPU", 0) for n in range(2)]
        if placed[:2] != wanted:
            raise AssertionError(f"instances {placed}, expected {wanted} (and one pair per further GPU)")

    def pinned(self) -> None:
        out, facts = http_infer(self.ports, "torch_pinned", self.data)
        _same(out, _expected(self.data))
        if (facts.get("devices"), facts.get("device")) != (1, 0) or not facts.get("visible"):
            raise AssertionError(f"a pinned stub should see one GPU, its cuda:0, facts {facts}")

    def stub_memory(self) -> None:
        row = _rows(self.ports)["torch_gpu_0_0@0"]
        held = row.get("gpu_memory_by_device") or {}
        if not held.get("0"):
            raise AssertionError(f"no GPU memory shown for torch_gpu's stub (pid {row['pid']}): {held}")
        series = {k: v for k, v in _metric(self.ports, "pystub_stub_gpu_memory_bytes").items()
                  if 'instance="torch_gpu_0_0"' in k}
        if not series or min(series.values()) <= 0:
            raise AssertionError(f"pystub_stub_gpu_memory_bytes has no series for torch_gpu_0_0: {series}")

    def memory_back(self) -> None:
        """A restarted, then an unloaded instance's device memory is back (NVML: its process is gone)."""
        hold = int(os.environ["GPU_CHECK_HOLD_BYTES"])
        _request(self.ports, "/v2/repository/models/torch_hold/load", b"")
        first = _rows(self.ports)["torch_hold_0_0@0"]
        if (first.get("gpu_memory_bytes") or 0) < hold:
            raise AssertionError(f"the stub holds {first.get('gpu_memory_bytes')} bytes, it allocated {hold}")
        _request(self.ports, "/v2/pystub/stubs/torch_hold/restart", b"")
        second = _rows(self.ports)["torch_hold_0_0@0"]
        if second["pid"] == first["pid"] or (second.get("gpu_memory_bytes") or 0) < hold:
            raise AssertionError(f"after a restart: pid {second['pid']} (was {first['pid']}), "
                                 f"{second.get('gpu_memory_bytes')} bytes")
        _request(self.ports, "/v2/repository/models/torch_hold/unload", b"")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pids = {str(pid) for pid in (first["pid"], second["pid"])}
            left = [k for k, v in _metric(self.ports, "pystub_stub_gpu_memory_bytes").items() if "torch_hold" in k]
            if not left and not any(pid in _nvml_pids() for pid in pids):
                return
            time.sleep(0.5)
        raise AssertionError("after the unload the driver still counts memory of torch_hold's processes")

    def gpu_metrics(self) -> None:
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            if _metric(self.ports, "nv_gpu_memory_total_bytes") and _metric(self.ports, "nv_gpu_utilization"):
                return
            time.sleep(0.2)
        raise AssertionError("no nv_gpu_* series within 30 s")


def _nvml_pids() -> set[str]:
    """The pids NVML counts compute memory for, on every GPU (none under --fake: the stand-in has no driver)."""
    from pystub_backend.devices import discover

    system = discover(os.environ)
    try:
        return {str(pid) for pid in system.process_memory()}
    finally:
        system.close()


CASES: tuple[tuple[str, str], ...] = (
    ("http_late", "a CUDA output written after a 50 ms kernel, unsynchronized, over HTTP"),
    ("grpc_late", "the same over gRPC"),
    ("side_stream", "from_dlpack of a tensor computed on the model's own stream, unsynchronized"),
    ("empty_output", "an empty GPU output, over HTTP and to a BLS caller that prefers the GPU"),
    ("cuda_shm_gpu_model", "client CUDA shared memory: a late GPU output copied device-to-device"),
    ("cuda_shm_cpu_model", "client CUDA shared memory: a CPU model's output copied host-to-device"),
    ("bls_mapped", "BLS answers on the GPU, mapped by CUDA IPC, written late"),
    ("bls_gpu_inputs", "BLS GPU inputs, unsynchronized, to a FORCE_CPU_ONLY_INPUT_TENSORS: no model"),
    ("bls_relay", "a BLS callee that returns a tensor it mapped"),
    ("bls_expandable", "a BLS callee whose memory is not from cudaMalloc (expandable segments)"),
    ("own_export", "an export opened in the exporting stub (an async model calling itself)"),
    ("two_instances", "a KIND_GPU model with two instances"),
    ("pinned", "PYSTUB_PIN_GPU: the stub sees its GPU alone, as cuda:0"),
    ("stub_memory", "each stub's GPU memory in /v2/pystub/stubs and pystub_stub_gpu_memory_bytes"),
    ("memory_back", "a restarted, then unloaded instance's GPU memory is back"),
    ("gpu_metrics", "the nv_gpu_* metrics"),
)


def _reason(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:400]}" if text else type(error).__name__


def run_cases(check: Check, deadline: float, only: tuple[str, ...] = ()) -> bool:
    passed = True
    for name, title in CASES:
        if only and name not in only:
            continue
        if time.monotonic() > deadline:
            print(f"FAIL  {title}: not run, the check's time budget ran out", flush=True)
            passed = False
            continue
        started = time.monotonic()
        try:
            getattr(check, name)()
            print(f"PASS  {title} ({time.monotonic() - started:.1f} s)", flush=True)
        except Exception as error:  # noqa: BLE001 - every case reports, whatever failed
            passed = False
            print(f"FAIL  {title}: {_reason(error)}", flush=True)
    return passed


def _median_ms(call: Callable[[], object], repeats: int) -> float:
    call()  # warm-up: CUDA context, arena growth, connections
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2] * 1000.0


def print_latencies(ports: dict[str, int], big_bytes: int, deadline: float) -> bool:
    import numpy as np

    big = np.ones(big_bytes // 4, dtype=np.float32)
    small = np.ones(1 << 20, dtype=np.float32)
    bls = {"rounds": 2}
    rows = [(f"{big_bytes // _MIB} MiB output to an HTTP client", ("torch_gpu", {}), ("numpy_cpu", {}), big),
            ("BLS call (4 MiB tensor, two hops)", ("bls_gpu", {**bls, "target": "torch_gpu", "prefer_gpu": True}),
             ("bls_cpu", {**bls, "target": "numpy_cpu"}), small)]
    ok = True
    for label, (gpu_model, gpu_parameters), (cpu_model, cpu_parameters), data in rows:
        if time.monotonic() > deadline:
            print(f"FAIL  latency, {label}: not measured, the check's time budget ran out", flush=True)
            ok = False
            continue
        try:
            gpu = _median_ms(lambda m=gpu_model, d=data, p=gpu_parameters: http_infer(ports, m, d, p), 7)
            cpu = _median_ms(lambda m=cpu_model, d=data, p=cpu_parameters: http_infer(ports, m, d, p), 7)
        except Exception as error:  # noqa: BLE001
            print(f"FAIL  latency, {label}: {_reason(error)}", flush=True)
            ok = False
            continue
        print(f"LATENCY  {label}: GPU path {gpu:.1f} ms, CPU path {cpu:.1f} ms (ratio {gpu / cpu:.2f}; medians "
              f"of 7, same run)", flush=True)
    return ok


# -- the machine ----------------------------------------------------------------------------------
def missing_modules() -> list[str]:
    import importlib

    missing = []
    for name in NEEDED:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an ImportError, or a module that cannot load on this Python
            missing.append(name)
    return missing


def install_carried_wheels(argv: list[str]) -> str | None:
    """Install .whl/ into SITE and run this script again with it on the path (once). Returns why
    it could not, or None when there is nothing to install."""
    wheels = sorted(glob.glob(str(WHEELS / "*.whl")))
    if not wheels or os.environ.get(_INSTALLED) or sys.version_info[:2] != (3, 12):  # they are cp312 wheels
        return None
    result = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                             "--no-cache-dir", "--upgrade", "--target", str(SITE), *wheels],
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        return f"pip could not install {WHEELS}: {' '.join(result.stderr.split())[-400:]}"
    path = os.pathsep.join(p for p in (str(SITE), os.environ.get("PYTHONPATH")) if p)
    os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *argv],
              dict(os.environ, PYTHONPATH=path, **{_INSTALLED: "1"}))
    return None  # not reached


def no_gpu_reason() -> str | None:
    """Why this machine cannot run the check on a real GPU, or None."""
    from pystub_backend.devices import discover

    system = discover(os.environ)
    try:
        if not system.gpus():
            return "NVML finds no GPU (no NVIDIA driver, none visible, or nvidia-ml-py missing)"
    finally:
        system.close()
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA device"
    return None


def _use_fake_machine() -> None:
    """The fake GPU for this process (the client) and the server it starts (and its stubs)."""
    from pystub_backend.devices import fake_bindings

    os.environ.update({"PYSTUB_FAKE_GPUS": "1", "GPU_CHECK_KIT": "fake", "GPU_CHECK_HOLD_BYTES": str(64 * _MIB)})
    fake_bindings.install("13")  # tritonclient's cuda_shared_memory imports cuda.bindings itself


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fake", action="store_true", help="run on pystub's fake GPU (no GPU, no PyTorch needed)")
    parser.add_argument("--budget-s", type=float, default=450.0, help="stop starting cases after this many seconds")
    parser.add_argument("--log", type=Path, help="copy pystub's log here")
    parser.add_argument("--only", nargs="*", default=(), help="run only these cases (names as in CASES)")
    args = parser.parse_args(argv)
    begun = time.monotonic()
    deadline = begun + args.budget_s
    why = install_carried_wheels(argv)
    if why is not None or missing_modules():
        print(f"FAIL  dependencies: {why or 'missing ' + ', '.join(missing_modules())} "
              f"(fetch them with tools/fetch_gpu_wheels.py and carry .whl/)", flush=True)
        return MISSING_EXIT
    if args.fake:
        _use_fake_machine()
    else:
        os.environ.setdefault("GPU_CHECK_HOLD_BYTES", str(1 << 30))
        reason = no_gpu_reason()
        if reason is not None:
            print(f"SKIP  no GPU: {reason}; nothing was checked", flush=True)
            return NO_GPU_EXIT
    import numpy as np

    data = np.random.default_rng(0).random(1 << 16, dtype=np.float32)
    with tempfile.TemporaryDirectory(prefix="pystub-gpu-check-") as workdir:
        repository = write_repository(Path(workdir) / "models")
        log_path = Path(workdir) / "pystub.log"
        started = time.monotonic()
        try:
            with running_pystub(repository, log_path, tuple(n for n in MODELS if n not in _LATER)) as ports:
                print(f"START pystub ready after {time.monotonic() - started:.1f} s ({len(MODELS) - len(_LATER)} "
                      f"models{', fake GPU' if args.fake else ''})", flush=True)
                passed = run_cases(Check(ports, data), deadline, tuple(args.only))
                passed = print_latencies(ports, (8 if args.fake else 64) * _MIB, deadline) and passed
        except ServerStartError as error:
            print(f"FAIL  pystub start: {error}", flush=True)
            passed = False
        if args.log is not None:
            args.log.write_bytes(log_path.read_bytes())
        if not passed:
            tail = log_path.read_text(errors="replace").splitlines()[-15:]
            print("pystub's last log lines:\n" + "\n".join(f"    log| {line}" for line in tail), flush=True)
    print(f"DONE  in {time.monotonic() - begun:.0f} s: {'all passed' if passed else 'FAILED'}", flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
