#!/usr/bin/env python3
"""The device check: pystub on a real NVIDIA GPU, every answer compared with PyTorch.

Runs in well under 10 minutes on a machine with one NVIDIA GPU, Python 3.12, PyTorch with CUDA,
and pystub's other dependencies installed from wheels prepared beforehand (docs/gpu.md):

    python tools/gpu_check.py            # one PASS/FAIL line per case, then the latencies

It writes its models into a temporary repository, starts pystub on free loopback ports, and checks:
a PyTorch model's CUDA output over HTTP and gRPC, BLS passing GPU tensors between two models (answers
mapped by the caller; inputs, to a callee with `FORCE_CPU_ONLY_INPUT_TENSORS: no`, by the callee), a
client CUDA shared-memory round trip (tritonclient.utils.cuda_shared_memory), a KIND_GPU model
with two instances, and the GPU metrics. It then prints the latency of a 64 MiB CUDA output to an
HTTP client and of a BLS GPU-to-GPU call, each beside the same tensor on the CPU path.

Exit status: 0 all passed, 1 a case failed, 3 no GPU (nothing checked; the line says why).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NO_GPU_EXIT = 3
_START_TIMEOUT_S = 180.0
_MIB = 1 << 20

_CONFIG = """backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ kind: {kind} count: {count}{gpus} }} ]
{parameters}"""
# Inputs on the GPU, as they are (BLS callers on GPU 0 hand them over by CUDA IPC).
_GPU_INPUTS = 'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value { string_value: "no" } }'
# OUT = IN * 2 + 1, computed on the instance's GPU and returned as a CUDA tensor; the response
# parameter "input_on_gpu" says where IN arrived.
_TORCH_MODEL = """
import torch
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.device = torch.device("cuda", int(args["model_instance_device_id"]))

    def execute(self, requests):
        responses = []
        for request in requests:
            inp = pb_utils.get_input_tensor_by_name(request, "IN")
            x = torch.from_dlpack(inp.to_dlpack()).to(self.device)
            out = (x * 2 + 1).contiguous()
            torch.cuda.synchronize(self.device)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor.from_dlpack("OUT", torch.utils.dlpack.to_dlpack(out))],
                parameters={"input_on_gpu": not inp.is_cpu()}))
        return responses
"""
# The same on the CPU path: a numpy output.
_CPU_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2 + 1)]) for r in requests]
"""
# BLS: calls `{callee}` with IN, then once more with its output: OUT = (IN * 2 + 1) * 2 + 1. The
# GPU variant asks for the answers on GPU 0 (`{preferred}`): the callee's CUDA output is mapped by
# CUDA IPC, not copied; the response parameters say whether the answers arrived as GPU tensors
# ("on_gpu") and how many of the callee's buffers this stub mapped meanwhile ("mapped"). With
# `{fresh}` each input is first copied into a new CUDA tensor on GPU 0 (a mapped answer cannot be
# exported again), and "inputs_on_gpu" says whether the callee got every input on the GPU.
_BLS_MODEL = """
import json
import triton_python_backend_utils as pb_utils
from pystub_backend.stub.features import bls


def _given(tensor, fresh):
    if not fresh:
        return tensor.to_dlpack()
    import torch
    copy = torch.from_dlpack(tensor.to_dlpack()).to("cuda:0").clone()
    torch.cuda.synchronize(copy.device)  # the callee reads it on its own streams
    return torch.utils.dlpack.to_dlpack(copy)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "IN")
            on_gpu, inputs_on_gpu, mapped = True, True, 0
            for _ in range(2):
                call = pb_utils.InferenceRequest(model_name="{callee}", inputs=[pb_utils.Tensor.from_dlpack(
                    "IN", _given(tensor, {fresh}))], requested_output_names=["OUT"]{preferred})
                answer = call.exec()
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                tensor = pb_utils.get_output_tensor_by_name(answer, "OUT")
                on_gpu = on_gpu and not tensor.is_cpu()
                inputs_on_gpu = inputs_on_gpu and json.loads(answer.parameters() or "{}").get("input_on_gpu", False)
                mapped = max(mapped, bls.inspect()["device_mappings"])
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("OUT", tensor.to_dlpack())],
                parameters={"on_gpu": on_gpu, "inputs_on_gpu": inputs_on_gpu, "mapped": mapped}))
        return responses
"""
_ON_GPU_0 = ",\n                    preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 0)"


def no_gpu_reason() -> str | None:
    """Why this machine cannot run the check, or None."""
    from pystub_backend.devices import discover

    system = discover(os.environ)
    try:
        if not system.gpus():
            return "NVML finds no GPU (no NVIDIA driver, none visible, or nvidia-ml-py missing: pip install '.[gpu]')"
    finally:
        system.close()
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA device"
    return None


def write_repository(root: Path, only: tuple[str, ...] = ()) -> Path:
    """The check's models under `root` (all, or those named in `only`)."""
    on_gpu_0 = (" gpus: [ 0 ]", _GPU_INPUTS)  # every instance on GPU 0, inputs on the GPU
    models = {
        "torch_gpu": (_TORCH_MODEL, "KIND_GPU", 1, ("", "")), "torch_gpu_two": (_TORCH_MODEL, "KIND_GPU", 2, ("", "")),
        "torch_gpu_inputs": (_TORCH_MODEL, "KIND_GPU", 1, on_gpu_0),
        "numpy_cpu": (_CPU_MODEL, "KIND_CPU", 1, ("", "")),
        "bls_gpu": (_bls("torch_gpu", _ON_GPU_0, fresh=False), "KIND_GPU", 1, ("", "")),
        "bls_gpu_inputs": (_bls("torch_gpu_inputs", _ON_GPU_0, fresh=True), "KIND_GPU", 1, (" gpus: [ 0 ]", "")),
        "bls_cpu": (_bls("numpy_cpu", "", fresh=False), "KIND_CPU", 1, ("", "")),
    }
    for name, (code, kind, count, (gpus, parameters)) in models.items():
        if only and name not in only:
            continue
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(code)
        (root / name / "config.pbtxt").write_text(_CONFIG.format(kind=kind, count=count, gpus=gpus,
                                                                 parameters=parameters))
    return root


def _bls(callee: str, preferred: str, fresh: bool) -> str:
    return _BLS_MODEL.replace("{callee}", callee).replace("{preferred}", preferred).replace("{fresh}", str(fresh))


def _free_ports(count: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


@contextlib.contextmanager
def running_pystub(repository: Path, log_path: Path) -> Iterator[dict[str, int]]:
    """pystub on free loopback ports, ready; stopped (SIGTERM, then SIGKILL) at the end."""
    http, grpc, metrics = _free_ports(3)
    command = [sys.executable, "-m", "pystub_backend.backend", "--model-repository", str(repository),
               f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
               "--metrics-interval-ms=200", "--allow-client-shm=true"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        _wait_ready(process, http, log_path)
        yield {"http": http, "grpc": grpc, "metrics": metrics}
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _wait_ready(process: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"pystub exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
        with contextlib.suppress(OSError), \
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as answer:
            if answer.status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"pystub not ready after {_START_TIMEOUT_S:.0f} s (waiting for /v2/health/ready):\n"
                       f"{log_path.read_text()[-3000:]}")


def _expected(data: object, rounds: int = 1) -> object:
    """The models' computation done directly in PyTorch, on the GPU."""
    import torch

    tensor = torch.from_numpy(data).cuda()  # type: ignore[call-overload]
    for _ in range(rounds):
        tensor = tensor * 2 + 1
    return tensor.cpu().numpy()


def _http_infer(ports: dict[str, int], model: str, data: object, parameters: dict[str, object] | None = None
                ) -> object:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http']}", network_timeout=300.0)
    try:
        tensor = httpclient.InferInput("IN", list(data.shape), "FP32")  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(data, binary_data=True)
        wanted = [httpclient.InferRequestedOutput("OUT", binary_data=True)]
        result = client.infer(model, [tensor], outputs=wanted)
        if parameters is not None:
            parameters.update(result.get_response().get("parameters", {}))
        return result.as_numpy("OUT")
    finally:
        client.close()


def _grpc_infer(ports: dict[str, int], model: str, data: object) -> object:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")
    try:
        tensor = grpcclient.InferInput("IN", list(data.shape), "FP32")  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(data)
        return client.infer(model, [tensor], client_timeout=300.0).as_numpy("OUT")
    finally:
        client.close()


def _cuda_shm_round_trip(ports: dict[str, int], data: object) -> object:
    import tritonclient.http as httpclient
    import tritonclient.utils.cuda_shared_memory as cudashm

    nbytes = data.nbytes  # type: ignore[attr-defined]
    client = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http']}")
    regions = [cudashm.create_shared_memory_region(name, nbytes, 0) for name in ("gc_in", "gc_out")]
    try:
        cudashm.set_shared_memory_region(regions[0], [data])
        for name, region in zip(("gc_in", "gc_out"), regions, strict=True):
            client.register_cuda_shared_memory(name, cudashm.get_raw_handle(region), 0, nbytes)
        tensor = httpclient.InferInput("IN", list(data.shape), "FP32")  # type: ignore[attr-defined]
        tensor.set_shared_memory("gc_in", nbytes)
        output = httpclient.InferRequestedOutput("OUT")
        output.set_shared_memory("gc_out", nbytes)
        client.infer("torch_gpu", [tensor], outputs=[output])
        return cudashm.get_contents_as_numpy(regions[1], data.dtype, data.shape)  # type: ignore[attr-defined]
    finally:
        client.unregister_cuda_shared_memory()
        for region in regions:
            cudashm.destroy_shared_memory_region(region)
        client.close()


def _two_instances(ports: dict[str, int], data: object) -> object:
    for _ in range(4):
        result = _http_infer(ports, "torch_gpu_two", data)
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['http']}/v2/pystub/stubs", timeout=30) as answer:
        rows = [row for row in json.loads(answer.read())["stubs"] if row["model"] == "torch_gpu_two"]
    placed = sorted((row["instance"], row["kind"], row["device_id"]) for row in rows)
    wanted = sorted((f"torch_gpu_two_0_{n}", "GPU", 0) for n in range(2))
    if placed[:2] != wanted:
        raise AssertionError(f"instances {placed}, expected {wanted} (and one pair per further GPU)")
    return result


def _bls_on_gpu(ports: dict[str, int], data: object, model: str = "bls_gpu") -> object:
    parameters: dict[str, object] = {}
    result = _http_infer(ports, model, data, parameters)
    if parameters.get("on_gpu") is not True or not parameters.get("mapped"):
        raise AssertionError(f"the BLS answers did not arrive as GPU tensors mapped by CUDA IPC "
                             f"(response parameters {parameters})")
    return result


def _bls_gpu_inputs(ports: dict[str, int], data: object) -> object:
    """GPU inputs to a FORCE_CPU_ONLY_INPUT_TENSORS "no" callee on the same GPU arrive there."""
    parameters: dict[str, object] = {}
    result = _http_infer(ports, "bls_gpu_inputs", data, parameters)
    if parameters.get("inputs_on_gpu") is not True or parameters.get("on_gpu") is not True:
        raise AssertionError(f"the callee did not get its BLS inputs on the GPU (response parameters {parameters})")
    return result


def _metrics(ports: dict[str, int]) -> None:
    import torch

    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['metrics']}/metrics", timeout=30) as answer:
            lines = answer.read().decode().splitlines()
        series = {line.split("{")[0]: line for line in lines if line.startswith("nv_gpu_memory_total_bytes{")}
        uuids = {line.split('gpu_uuid="')[1].split('"')[0] for line in lines if line.startswith("nv_gpu_utilization{")}
        if series and len(uuids) == torch.cuda.device_count():
            return
        time.sleep(0.2)
    raise AssertionError("no nv_gpu_* series with one gpu_uuid per CUDA device within 30 s")


def run_cases(ports: dict[str, int]) -> bool:
    import numpy as np

    data = np.random.default_rng(0).random(1 << 16, dtype=np.float32)
    cases: list[tuple[str, Callable[[], object], object]] = [
        ("PyTorch CUDA output over HTTP", lambda: _http_infer(ports, "torch_gpu", data), _expected(data)),
        ("PyTorch CUDA output over gRPC", lambda: _grpc_infer(ports, "torch_gpu", data), _expected(data)),
        ("BLS passing GPU tensors between two models", lambda: _bls_on_gpu(ports, data), _expected(data, 2)),
        ("BLS GPU inputs to a FORCE_CPU_ONLY_INPUT_TENSORS: no model", lambda: _bls_gpu_inputs(ports, data),
         _expected(data, 2)),
        ("client CUDA shared memory round trip", lambda: _cuda_shm_round_trip(ports, data), _expected(data)),
        ("KIND_GPU model with two instances", lambda: _two_instances(ports, data), _expected(data)),
        ("GPU metrics scrape", lambda: _metrics(ports), None),
    ]
    passed = True
    for name, call, expected in cases:
        try:
            result = call()
            if expected is not None:
                np.testing.assert_allclose(result, expected, rtol=1e-6)  # type: ignore[arg-type]
            print(f"PASS  {name}", flush=True)
        except Exception as error:  # noqa: BLE001 - every case reports, whatever failed
            passed = False
            print(f"FAIL  {name}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}",
                  flush=True)
    return passed


def _median_ms(call: Callable[[], object], repeats: int = 7) -> float:
    call()  # warm-up: CUDA context, arena growth, connections
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2] * 1000.0


def print_latencies(ports: dict[str, int]) -> None:
    import numpy as np

    big = np.ones(64 * _MIB // 4, dtype=np.float32)
    small = np.ones(1 << 20, dtype=np.float32)
    rows = [("64 MiB output to an HTTP client", "torch_gpu", "numpy_cpu", big),
            ("BLS call (4 MiB tensor, two hops)", "bls_gpu", "bls_cpu", small)]
    for label, gpu_model, cpu_model, data in rows:
        gpu = _median_ms(lambda m=gpu_model, d=data: _http_infer(ports, m, d))
        cpu = _median_ms(lambda m=cpu_model, d=data: _http_infer(ports, m, d))
        print(f"LATENCY  {label}: GPU path {gpu:.1f} ms, CPU path {cpu:.1f} ms (ratio {gpu / cpu:.2f})", flush=True)


def main() -> int:
    reason = no_gpu_reason()
    if reason is not None:
        print(f"SKIP  no GPU: {reason}; nothing was checked", flush=True)
        return NO_GPU_EXIT
    with tempfile.TemporaryDirectory(prefix="pystub-gpu-check-") as workdir:
        repository = write_repository(Path(workdir) / "models")
        log_path = Path(workdir) / "pystub.log"
        with running_pystub(repository, log_path) as ports:
            passed = run_cases(ports)
            print_latencies(ports)
        if not passed:
            print(f"pystub's log:\n{log_path.read_text()[-4000:]}", flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
