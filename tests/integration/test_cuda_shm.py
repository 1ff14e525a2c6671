"""Client CUDA shared memory on the fake machine (PYSTUB_FAKE_GPUS=2): the test plays the client with
tritonclient's own `cuda_shared_memory` module, running on the stand-in cuda-bindings (13.x shape:
its `get_raw_handle` reads the handle through `getPtr()`), over HTTP and gRPC. The stub opens the
handle (the backend never does), reads inputs from it and writes outputs into it: a CPU model's
output host-to-device, a GPU model's device-to-device, one on another GPU by the peer copy; each
copy is done before the response, so the client, reading its buffer from its own process, sees
the output (the fake lands nothing a process did not wait for). Bounds, unknown devices and bad
handles get Triton's texts; an unregister answers once the stubs closed their handles."""

from __future__ import annotations

import base64
import gc
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import Backend, module_backend
from tritonclient.utils import InferenceServerException

from pystub_backend.devices import FAKE_VARIABLE, fake_bindings, fake_engine

cudashm: Any = None  # tritonclient.utils.cuda_shared_memory, imported on the stand-in by `_client_side`


@pytest.fixture(scope="module", autouse=True)
def _client_side() -> Iterator[None]:
    """This process is the client, on the same fake machine: `import cuda.bindings.runtime` finds the
    stand-in (for tritonclient) while this module runs; other tests' backends see no GPU again after."""
    global cudashm
    saved = {name: module for name, module in sys.modules.items() if name == "cuda" or name.startswith("cuda.")}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(FAKE_VARIABLE, "2")
        fake_bindings.install("13")
        cudashm = importlib.import_module("tritonclient.utils.cuda_shared_memory")
        yield
    for name in [n for n in sys.modules if n == "cuda" or n.startswith("cuda.")
                 or n.startswith("tritonclient.utils.cuda_shared_memory")]:
        del sys.modules[name]
    sys.modules.update(saved)
    cudashm = None

_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils
from pystub_backend.devices import fake_cuda_capsule, fake_device_array, fake_write_later


class TritonPythonModel:
    def initialize(self, args):
        self.gpu = args["model_instance_kind"] == "GPU"
        self.device = int(args["model_instance_device_id"])

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy() * 2
            out = pb_utils.Tensor("OUT", data)
            if self.gpu:  # written by a kernel the model does not wait for
                device = fake_device_array(np.zeros_like(data), self.device)
                fake_write_later(device, data, self.device)
                out = pb_utils.Tensor.from_dlpack("OUT", fake_cuda_capsule(device, self.device))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
'''
_CONFIG = '''backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ kind: {kind} count: 1 {gpus} }} ]
'''
_N = 256
_NBYTES = _N * 4


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    root = Path(tmp_path_factory.mktemp("cuda_shm"))
    for name, kind, gpus in (("cpu_double", "KIND_CPU", ""), ("gpu_double", "KIND_GPU", "gpus: [ 1 ]"),
                             ("gpu0_double", "KIND_GPU", "gpus: [ 0 ]")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(_MODEL)
        (root / name / "config.pbtxt").write_text(_CONFIG.format(kind=kind, gpus=gpus))
    with module_backend(Backend(root, "--allow-client-shm=true", env={FAKE_VARIABLE: "2"})) as started:
        yield started


class _ClientRegions:
    """The client's two CUDA regions (input, output) on one fake GPU, made by tritonclient."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.input = cudashm.create_shared_memory_region("cin", _NBYTES, device)
        self.output = cudashm.create_shared_memory_region("cout", _NBYTES, device)

    def handle(self, region: object) -> str:
        return cudashm.get_raw_handle(region).decode()

    def write_input(self, data: np.ndarray) -> None:
        cudashm.set_shared_memory_region(self.input, [data])

    def read_output(self) -> np.ndarray:
        return cudashm.get_contents_as_numpy(self.output, np.float32, [_N])

    def mapped_by_a_stub(self) -> bool:
        return any(fake_engine.mapped_elsewhere(region._base_addr) for region in (self.input, self.output))

    def destroy(self) -> None:
        """tritonclient's destroy forgets the region; its cudaFree runs once the last reference goes."""
        for region in (self.input, self.output):
            cudashm.destroy_shared_memory_region(region)
        del self.input, self.output
        gc.collect()


@pytest.fixture
def regions() -> Iterator[_ClientRegions]:
    client = _ClientRegions(1)
    yield client
    assert not client.mapped_by_a_stub(), "a stub still maps the client's CUDA buffer after unregistering"
    client.destroy()


def _http_round_trip(backend: Backend, regions: _ClientRegions, model: str) -> np.ndarray:
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        client.register_cuda_shared_memory("cin", regions.handle(regions.input), regions.device, _NBYTES)
        client.register_cuda_shared_memory("cout", regions.handle(regions.output), regions.device, _NBYTES)
        status = client.get_cuda_shared_memory_status()
        assert sorted((r["name"], r["device_id"], r["byte_size"]) for r in status) == [
            ("cin", 1, _NBYTES), ("cout", 1, _NBYTES)]
        tensor = httpclient.InferInput("IN", [_N], "FP32")
        tensor.set_shared_memory("cin", _NBYTES)
        output = httpclient.InferRequestedOutput("OUT", binary_data=True)
        output.set_shared_memory("cout", _NBYTES)
        client.infer(model, [tensor], outputs=[output])
        return regions.read_output()
    finally:
        client.unregister_cuda_shared_memory()
        assert not regions.mapped_by_a_stub()  # closed before the unregister answered: the client may free
        assert client.get_cuda_shared_memory_status() == []
        client.close()


@pytest.mark.parametrize("model", ["cpu_double", "gpu_double", "gpu0_double"],
                         ids=["host-to-device", "device-to-device", "from-another-gpu"])
def test_inputs_are_read_from_and_outputs_written_to_the_clients_device_buffer(
        backend: Backend, regions: _ClientRegions, model: str) -> None:
    data = np.random.default_rng(3).random(_N, dtype=np.float32)
    regions.write_input(data)
    np.testing.assert_array_equal(_http_round_trip(backend, regions, model), data * 2)


def test_grpc_registers_reports_and_serves_a_cuda_region(backend: Backend, regions: _ClientRegions) -> None:
    data = np.arange(_N, dtype=np.float32)
    regions.write_input(data)
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        client.register_cuda_shared_memory("gin", regions.handle(regions.input), regions.device, _NBYTES)
        client.register_cuda_shared_memory("gout", regions.handle(regions.output), regions.device, _NBYTES)
        regions_found = client.get_cuda_shared_memory_status(as_json=True)["regions"]
        assert {name: (int(r["device_id"]), int(r["byte_size"])) for name, r in regions_found.items()} == {
            "gin": (1, _NBYTES), "gout": (1, _NBYTES)}
        tensor = grpcclient.InferInput("IN", [_N], "FP32")
        tensor.set_shared_memory("gin", _NBYTES)
        output = grpcclient.InferRequestedOutput("OUT")
        output.set_shared_memory("gout", _NBYTES)
        client.infer("gpu_double", [tensor], outputs=[output])
        np.testing.assert_array_equal(regions.read_output(), data * 2)
    finally:
        client.unregister_cuda_shared_memory()
        client.close()
    _until_unmapped(regions)  # the gRPC unregister does not wait for the stubs yet


def _until_unmapped(regions: _ClientRegions, timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while regions.mapped_by_a_stub():
        assert time.monotonic() < deadline, f"a stub still maps the client's CUDA buffer after {timeout:g} s"
        time.sleep(0.05)


def _refusal(call: object) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as caught:
        call()  # type: ignore[operator]
    return str(caught.value.status()), caught.value.message()


def test_bad_registrations_and_requests_get_tritons_texts(backend: Backend, regions: _ClientRegions) -> None:
    client = httpclient.InferenceServerClient(backend.http_url)
    good = regions.handle(regions.input)
    try:
        assert "cuda_shared_memory" in client.get_server_metadata()["extensions"]
        assert _refusal(lambda: client.register_cuda_shared_memory("r", good, 5, _NBYTES)) == (
            "400", "failed to register CUDA shared memory region 'r': invalid device id 5 (visible GPUs: 0, 1)")
        short = base64.b64encode(b"x" * 10).decode()
        assert _refusal(lambda: client.register_cuda_shared_memory("r", short, 1, _NBYTES)) == (
            "400", "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
        client.register_cuda_shared_memory("r", good, 1, _NBYTES)
        assert _refusal(lambda: client.register_cuda_shared_memory("r", good, 1, _NBYTES)) == (
            "400", "shared memory region 'r' already in manager")
        tensor = httpclient.InferInput("IN", [_N + 1], "FP32")
        tensor.set_shared_memory("r", _NBYTES + 4)  # one element past the region
        assert _refusal(lambda: client.infer("cpu_double", [tensor])) == (
            "400", "Invalid offset + byte size for shared memory region: 'r'")
        tensor = httpclient.InferInput("IN", [_N], "FP32")
        tensor.set_shared_memory("r", _NBYTES)
        output = httpclient.InferRequestedOutput("OUT", binary_data=True)
        output.set_shared_memory("r", 8)  # too small for the output
        status, text = _refusal(lambda: client.infer("cpu_double", [tensor], outputs=[output]))
        assert (status, text) == ("400", "shared memory size specified with the request for output 'OUT' "
                                         f"(8 bytes) should be at least {_NBYTES} bytes to hold the results")
        bogus = base64.b64encode(bytes(64)).decode()  # 64 bytes, but no process exported it
        client.register_cuda_shared_memory("bogus", bogus, 1, _NBYTES)
        tensor.set_shared_memory("bogus", _NBYTES)
        status, text = _refusal(lambda: client.infer("cpu_double", [tensor]))
        assert status == "400" and "failed to open CUDA IPC handle" in text, text
    finally:
        client.unregister_cuda_shared_memory()
        client.close()
