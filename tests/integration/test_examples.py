"""The example models through a real backend, with the real tritonclient over HTTP and gRPC."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import ROOT, Backend


@pytest.fixture(scope="module")
def backend(examples_backend: Backend) -> Backend:
    return examples_backend  # what the shared `http` and `grpc` client fixtures connect to


def _add_sub_inputs(module, binary: bool = True):
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 0.5, dtype=np.float32)
    inputs = [module.InferInput("INPUT0", [4], "FP32"), module.InferInput("INPUT1", [4], "FP32")]
    if module is httpclient:
        inputs[0].set_data_from_numpy(a, binary_data=binary)
        inputs[1].set_data_from_numpy(b, binary_data=binary)
    else:
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
    return a, b, inputs


def test_health_and_server_metadata(http, grpc):
    assert http.is_server_live() and http.is_server_ready()
    assert grpc.is_server_live() and grpc.is_server_ready()
    metadata = http.get_server_metadata()
    assert metadata["name"] == "pystub"
    assert "binary_tensor_data" in metadata["extensions"]
    assert grpc.get_server_metadata().name == "pystub"


@pytest.mark.parametrize("model", ["add_sub", "identity_fp32", "string_identity"])
def test_model_ready_metadata_and_config(http, grpc, model):
    assert http.is_model_ready(model) and grpc.is_model_ready(model)
    assert http.get_model_metadata(model)["name"] == model
    assert grpc.get_model_metadata(model).name == model
    config = http.get_model_config(model)
    assert config["name"] == model
    assert config["backend"] == "python"
    assert grpc.get_model_config(model).config.name == model


def test_identity_metadata_has_batch_dimension(http, grpc):
    metadata = http.get_model_metadata("identity_fp32")
    assert metadata["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}]
    assert metadata["versions"] == ["1"]
    assert list(grpc.get_model_metadata("identity_fp32").inputs[0].shape) == [-1, -1]
    assert http.get_model_config("identity_fp32")["max_batch_size"] == 8


@pytest.mark.parametrize("binary", [True, False])
def test_add_sub_http(http, binary):
    a, b, inputs = _add_sub_inputs(httpclient, binary)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary)]
    result = http.infer("add_sub", inputs, outputs=outputs, request_id="req-7")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert response["id"] == "req-7"
    assert response["model_name"] == "add_sub" and response["model_version"] == "1"


def test_add_sub_grpc(grpc):
    a, b, inputs = _add_sub_inputs(grpcclient)
    result = grpc.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_requested_outputs_are_honoured(http, grpc):
    a, b, inputs = _add_sub_inputs(httpclient)
    result = http.infer("add_sub", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    _, _, inputs = _add_sub_inputs(grpcclient)
    result = grpc.infer("add_sub", inputs, outputs=[grpcclient.InferRequestedOutput("OUTPUT0")])
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT0"]


@pytest.mark.parametrize("shape", [[1, 1], [3, 5], [8, 1000]])
def test_identity_batched_both_protocols(http, grpc, shape):
    data = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for module, client in ((httpclient, http), (grpcclient, grpc)):
        inputs = [module.InferInput("INPUT0", shape, "FP32")]
        inputs[0].set_data_from_numpy(data)
        result = client.infer("identity_fp32", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def test_identity_large_tensor_grpc(grpc):
    data = np.arange(8 * 1024 * 1024, dtype=np.float32).reshape(8, -1)  # 32 MiB: above gRPC's 4 MiB default
    inputs = [grpcclient.InferInput("INPUT0", list(data.shape), "FP32")]
    inputs[0].set_data_from_numpy(data)
    np.testing.assert_array_equal(grpc.infer("identity_fp32", inputs).as_numpy("OUTPUT0"), data)


@pytest.mark.parametrize("binary", [True, False])
def test_string_identity(http, grpc, binary):
    data = np.array([b"hello", "wörld".encode(), b"", b"x" * 10000], dtype=np.object_)
    inputs = [httpclient.InferInput("INPUT0", [4], "BYTES")]
    inputs[0].set_data_from_numpy(data, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
    returned = http.infer("string_identity", inputs, outputs=outputs).as_numpy("OUTPUT0")
    # JSON carries BYTES as strings, and tritonclient hands them back as str
    assert [x if isinstance(x, bytes) else x.encode() for x in returned] == list(data)
    inputs = [grpcclient.InferInput("INPUT0", [4], "BYTES")]
    inputs[0].set_data_from_numpy(data)
    assert list(grpc.infer("string_identity", inputs).as_numpy("OUTPUT0")) == list(data)


def test_plain_json_request_like_curl(examples_backend: Backend):
    body = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                       {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [[1, 1], [1, 1]]}]}
    request = urllib.request.Request(f"http://{examples_backend.http_url}/v2/models/add_sub/infer",
                                     data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("application/json")
        reply = json.loads(response.read())
    outputs = {o["name"]: o for o in reply["outputs"]}
    assert outputs["OUTPUT0"]["data"] == [2, 3, 4, 5]
    assert outputs["OUTPUT1"] == {"name": "OUTPUT1", "datatype": "FP32", "shape": [4], "data": [0, 1, 2, 3]}


def test_concurrent_requests_on_both_protocols(examples_backend: Backend):
    def one(index: int) -> bool:
        module = grpcclient if index % 2 else httpclient
        client = module.InferenceServerClient(examples_backend.grpc_url if index % 2 else examples_backend.http_url)
        try:
            data = np.full((1, 16), index, dtype=np.float32)
            inputs = [module.InferInput("INPUT0", [1, 16], "FP32")]
            inputs[0].set_data_from_numpy(data)
            return bool(np.array_equal(client.infer("identity_fp32", inputs).as_numpy("OUTPUT0"), data))
        finally:
            client.close()

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        assert all(pool.map(one, range(64)))


def test_repository_index_and_statistics(http, grpc):
    index = {row["name"]: row for row in http.get_model_repository_index()}
    assert set(index) == {"add_sub", "identity_fp32", "string_identity"}
    assert all(row["state"] == "READY" and row["version"] == "1" for row in index.values())
    assert {m.name for m in grpc.get_model_repository_index().models} == set(index)

    before = http.get_inference_statistics("add_sub")["model_stats"][0]
    _, _, inputs = _add_sub_inputs(httpclient)
    for _ in range(3):
        http.infer("add_sub", inputs)
    after = http.get_inference_statistics("add_sub")["model_stats"][0]
    assert after["inference_stats"]["success"]["count"] == before["inference_stats"]["success"]["count"] + 3
    assert after["execution_count"] == before["execution_count"] + 3
    assert after["last_inference"] > 0
    grpc_stats = grpc.get_inference_statistics("add_sub").model_stats[0]
    assert grpc_stats.inference_stats.success.count == after["inference_stats"]["success"]["count"]


def test_metrics_endpoint(examples_backend: Backend, http):
    _, _, inputs = _add_sub_inputs(httpclient)
    http.infer("add_sub", inputs)
    with urllib.request.urlopen(examples_backend.metrics_url, timeout=30) as response:
        text = response.read().decode()
    assert 'nv_inference_request_success{model="add_sub",version="1"}' in text


def test_stubs_are_direct_children_named_like_triton(examples_backend: Backend):
    stubs = examples_backend.stub_processes()
    assert len(stubs) == 3
    for stub in stubs:
        assert stub.ppid() == examples_backend.pid
        assert "triton_python_backend_stub" in " ".join(stub.cmdline())


def test_stubctl_lists_every_stub(examples_backend: Backend):
    url = examples_backend.http_url
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "stubctl"), "--url", url],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:6] == ["MODEL", "VER", "INSTANCE", "DEVICE", "PID", "STATE"]
    assert {line.split()[3] for line in lines[1:]} == {"CPU"}  # no GPU here: every example runs on the CPU
    pids = {str(p.pid) for p in examples_backend.stub_processes()}
    assert {line.split()[4] for line in lines[1:]} == pids
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "stubctl"), "--url", url, "--json"],
                            capture_output=True, text=True, timeout=30)
    rows = json.loads(result.stdout)
    assert {row["instance"] for row in rows} == {"add_sub_0_0", "identity_fp32_0_0", "string_identity_0"}
    assert all(row["healthy"] and row["heartbeat_age_s"] < 5 for row in rows)
