"""A model's GPU tensors reach HTTP and gRPC clients: on the fake machine (PYSTUB_FAKE_GPUS=2) a
KIND_GPU model returns `Tensor.from_dlpack` of a CUDA capsule of fake device memory on its
instance's device, written by a kernel it never waits for; the stub copies it once into the
response's arena block, through the CUDA code a real GPU runs (pystub_backend.stub.device_outputs);
an empty GPU output is an empty output."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import Backend, module_backend

from pystub_backend.devices import FAKE_VARIABLE

_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils
from pystub_backend.devices import fake_cuda_capsule, fake_device_array, fake_write_later


class TritonPythonModel:
    def initialize(self, args):
        self.device = int(args["model_instance_device_id"])

    def execute(self, requests):
        responses = []
        for request in requests:
            doubled = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy() * 2
            device = fake_device_array(np.zeros_like(doubled), self.device)
            fake_write_later(device, doubled, self.device)  # queued: lands only when someone waits
            out = pb_utils.Tensor.from_dlpack("OUT", fake_cuda_capsule(device, self.device))
            if out.is_cpu():
                raise pb_utils.TritonModelException("a CUDA capsule made a CPU tensor")
            responses.append(pb_utils.InferenceResponse([out, pb_utils.Tensor("DEVICE", np.array([self.device]))]))
        return responses
'''
_CONFIG = '''backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "DEVICE" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { kind: KIND_GPU count: 1 } ]
'''


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    root = Path(tmp_path_factory.mktemp("gpu_outputs"))
    (root / "gpu_double" / "1").mkdir(parents=True)
    (root / "gpu_double" / "1" / "model.py").write_text(_MODEL)
    (root / "gpu_double" / "config.pbtxt").write_text(_CONFIG)
    with module_backend(Backend(root, env={FAKE_VARIABLE: "2"})) as started:
        yield started


@pytest.mark.parametrize("size", [0, 4, 3 << 20], ids=["empty", "small", "12MiB"])
def test_http_client_gets_the_gpu_output(backend: Backend, size: int) -> None:
    data = np.random.default_rng(size).random(size, dtype=np.float32)
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        tensor = httpclient.InferInput("IN", [size], "FP32")
        tensor.set_data_from_numpy(data, binary_data=True)
        wanted = [httpclient.InferRequestedOutput("OUT", binary_data=True)]
        result = client.infer("gpu_double", [tensor], outputs=wanted)
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("OUT"), data * 2)


def test_grpc_client_gets_the_gpu_output_from_each_device(backend: Backend) -> None:
    data = np.arange(100, dtype=np.float32)
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    devices = set()
    try:
        tensor = grpcclient.InferInput("IN", [100], "FP32")
        tensor.set_data_from_numpy(data)
        for _ in range(8):
            result = client.infer("gpu_double", [tensor])
            np.testing.assert_array_equal(result.as_numpy("OUT"), data * 2)
            devices.add(int(result.as_numpy("DEVICE")[0]))
    finally:
        client.close()
    assert devices <= {0, 1} and devices
