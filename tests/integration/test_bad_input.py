"""Bad input gets a clear error with the right status, and nothing else breaks."""

from __future__ import annotations

import concurrent.futures
import json
import re
import struct
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import Backend, make_repository, module_backend
from tritonclient.utils import InferenceServerException


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("bad_input"), "add_sub", "identity_fp32",
                                 "string_identity", "raiser", "bad_return", "slow")
    with module_backend(Backend(repository)) as server:
        yield server


def post(backend: Backend, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://{backend.http_url}{path}", data=body, method="POST",
                                     headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def fp32_input(module, name: str, data: np.ndarray, datatype: str = "FP32"):
    tensor = module.InferInput(name, list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    return tensor


def grpc_error(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


# -- lookups ---------------------------------------------------------------------------------------
def test_unknown_model_and_version(backend: Backend, http, grpc):
    status, body = post(backend, "/v2/models/nope/infer", b'{"inputs": []}')
    assert status == 404
    assert body == {"error": "Request for unknown model: 'nope' is not found"}
    error = grpc_error(lambda: grpc.infer("nope", [fp32_input(grpcclient, "INPUT0", np.zeros(4, np.float32))]))
    assert error.status() == "StatusCode.NOT_FOUND"
    assert "Request for unknown model: 'nope' is not found" in error.message()
    status, body = post(backend, "/v2/models/add_sub/versions/7/infer", b'{"inputs": []}')
    assert status == 404 and body["error"] == "Request for unknown model: 'add_sub' version 7 is not found"
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/health/ready", timeout=10) as response:
        assert response.status == 200


# -- input validation over HTTP (status 400) and gRPC (INVALID_ARGUMENT) ----------------------------
def test_missing_input(backend: Backend, http, grpc):
    only_one = np.zeros(4, np.float32)
    with pytest.raises(InferenceServerException) as info:
        http.infer("add_sub", [fp32_input(httpclient, "INPUT0", only_one)])
    assert info.value.status() == "400"
    assert ("expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['INPUT0'], but missing "
            "required input(s) ['INPUT1']. Please provide all required input(s).") in info.value.message()
    error = grpc_error(lambda: grpc.infer("add_sub", [fp32_input(grpcclient, "INPUT0", only_one)]))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "missing required input(s) ['INPUT1']" in error.message()


def _json_inputs(*names: str) -> bytes:
    return json.dumps({"inputs": [{"name": n, "shape": [4], "datatype": "FP32", "data": [0, 0, 0, 0]}
                                  for n in names]}).encode()


def test_unexpected_input(backend: Backend):
    status, reply = post(backend, "/v2/models/add_sub/infer", _json_inputs("INPUT0", "EXTRA"))
    assert status == 400
    assert reply["error"] == "unexpected inference input 'EXTRA' for model 'add_sub'"


def test_too_many_inputs(backend: Backend):
    # Triton checks the count first, and prints its list with the upstream quirk "input(s) ]" (and in the
    # order of its unordered_map: the reverse of the request's for these three).
    status, reply = post(backend, "/v2/models/add_sub/infer", _json_inputs("INPUT0", "INPUT1", "EXTRA"))
    assert status == 400
    assert reply["error"] == ("[request id: <id_unknown>] expected 2 inputs but got 3 inputs for model 'add_sub'. "
                              "Got input(s) ['EXTRA','INPUT1','INPUT0'], but missing required input(s) ]. "
                              "Please provide all required input(s).")


def test_wrong_datatype(backend: Backend, http, grpc):
    ints = np.zeros(4, np.int32)
    floats = np.zeros(4, np.float32)
    with pytest.raises(InferenceServerException) as info:
        http.infer("add_sub", [fp32_input(httpclient, "INPUT0", ints, "INT32"),
                               fp32_input(httpclient, "INPUT1", floats)])
    assert info.value.status() == "400"
    assert "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'" in info.value.message()
    error = grpc_error(lambda: grpc.infer("add_sub", [fp32_input(grpcclient, "INPUT0", ints, "INT32"),
                                                      fp32_input(grpcclient, "INPUT1", floats)]))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "data-type is 'INT32'" in error.message()


def test_wrong_shape(backend: Backend, http, grpc):
    three = np.zeros(3, np.float32)
    four = np.zeros(4, np.float32)
    with pytest.raises(InferenceServerException) as info:
        http.infer("add_sub", [fp32_input(httpclient, "INPUT0", three), fp32_input(httpclient, "INPUT1", four)])
    assert info.value.status() == "400"
    assert "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [4], got [3]" in info.value.message()
    error = grpc_error(lambda: grpc.infer("add_sub", [fp32_input(grpcclient, "INPUT0", three),
                                                      fp32_input(grpcclient, "INPUT1", four)]))
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and "INPUT0" in error.message()


def test_byte_size_mismatch(backend: Backend):
    header = json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 12}},
        {"name": "INPUT1", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]}).encode()
    body = header + b"\0" * 28
    status, reply = post(backend, "/v2/models/add_sub/infer", body,
                         {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400
    assert "INPUT0" in reply["error"] and "12" in reply["error"]


def test_malformed_json_and_bad_binary_header(backend: Backend):
    status, reply = post(backend, "/v2/models/add_sub/infer", b'{"inputs": [')
    assert status == 400 and reply["error"]
    status, reply = post(backend, "/v2/models/add_sub/infer", b'{"inputs": []}',
                         {"Inference-Header-Content-Length": "99999"})
    assert status == 400 and reply["error"]
    status, reply = post(backend, "/v2/models/add_sub/infer", b'{"inputs": []}',
                         {"Inference-Header-Content-Length": "-1"})
    assert status == 400 and reply["error"]


def test_batch_larger_than_max_batch_size(backend: Backend, http, grpc):
    data = np.zeros((9, 2), np.float32)
    with pytest.raises(InferenceServerException) as info:
        http.infer("identity_fp32", [fp32_input(httpclient, "INPUT0", data)])
    assert info.value.status() == "400"
    assert "inference request batch-size must be <= 8 for 'identity_fp32'" in info.value.message()
    error = grpc_error(lambda: grpc.infer("identity_fp32", [fp32_input(grpcclient, "INPUT0", data)]))
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and "batch-size must be <= 8" in error.message()


def test_raw_binary_input_with_wrong_length(backend: Backend):
    status, reply = post(backend, "/v2/models/identity_fp32/infer", struct.pack("<3f", 1, 2, 3)[:-1],
                         {"Inference-Header-Content-Length": "0"})
    assert status == 400 and reply["error"]


# -- models that misbehave -------------------------------------------------------------------------
def test_model_exception_fails_only_that_request(backend: Backend, http, grpc):
    with pytest.raises(InferenceServerException) as info:
        http.infer("raiser", [fp32_input(httpclient, "INPUT0", np.array([-3], np.int32), "INT32")])
    assert info.value.status() == "500"
    # Triton's text, ending with the model's frames ("At:" tail, as Triton's pybind11 lists them)
    assert re.fullmatch(r"Failed to process the request\(s\) for model 'raiser_0', message: ValueError: boom: "
                        r"negative input -3\n\nAt:\n  \S+/raiser/1/model\.py\(\d+\): execute\n", info.value.message())
    ok = grpc.infer("raiser", [fp32_input(grpcclient, "INPUT0", np.array([5], np.int32), "INT32")])
    assert ok.as_numpy("OUTPUT0").tolist() == [5]
    assert "boom: negative input -3" in backend.log()


def test_model_error_response_keeps_its_code(http, grpc):
    with pytest.raises(InferenceServerException) as info:
        http.infer("raiser", [fp32_input(httpclient, "INPUT0", np.array([1], np.int32), "INT32")])
    assert info.value.status() == "400" and info.value.message() == "this request alone fails"
    error = grpc_error(lambda: grpc.infer("raiser", [fp32_input(grpcclient, "INPUT0", np.array([1], np.int32),
                                                                 "INT32")]))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"


@pytest.mark.parametrize("mode, text", [
    (1, "Expected a list in the execute return, found type '<class 'int'>'."),
    (2, "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
        "InferenceRequest(s) size is:1, and InferenceResponse(s) size is:0"),
    (3, "Expected an 'InferenceResponse' object in the execute function return list, found type "
        "'<class 'str'>'."),
])
def test_execute_return_rules(http, mode, text):
    with pytest.raises(InferenceServerException) as info:
        http.infer("bad_return", [fp32_input(httpclient, "MODE", np.array([mode], np.int32), "INT32")])
    assert info.value.message().startswith("Failed to process the request(s) for model 'bad_return_0', message: ")
    assert text in info.value.message()


def test_failures_do_not_disturb_concurrent_requests(backend: Backend):
    def good(index: int) -> bool:
        client = grpcclient.InferenceServerClient(backend.grpc_url)
        try:
            data = np.full(4, index, np.float32)
            result = client.infer("add_sub", [fp32_input(grpcclient, "INPUT0", data),
                                              fp32_input(grpcclient, "INPUT1", data)])
            return bool(np.array_equal(result.as_numpy("OUTPUT0"), data * 2))
        finally:
            client.close()

    def bad(_: int) -> str:
        client = grpcclient.InferenceServerClient(backend.grpc_url)
        try:
            client.infer("raiser", [fp32_input(grpcclient, "INPUT0", np.array([-1], np.int32), "INT32")])
            return "no error"
        except InferenceServerException as error:
            return error.message()
        finally:
            client.close()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        goods = pool.map(good, range(40))
        bads = pool.map(bad, range(20))
        assert all(goods)
        assert all("boom" in text for text in bads)


def test_error_bodies_for_routes(backend: Backend):
    for path, code, text in (("/v2/nothing/here", 404, "Not Found"),):
        try:
            urllib.request.urlopen(f"http://{backend.http_url}{path}", timeout=10)
        except urllib.error.HTTPError as error:
            assert error.code == code and json.loads(error.read()) == {"error": text}
        else:
            pytest.fail(f"{path} should fail")
