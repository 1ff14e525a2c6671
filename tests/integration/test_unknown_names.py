"""Names the repository does not hold leave no state, and names no model can have are refused
, on a real backend over HTTP and gRPC.

Before: 40 loads + 30 unloads of unknown 1 MiB names grew the backend by about 115 MiB (an index
row and a lock per name, kept forever; the error text, holding the name, was too large for gRPC's
trailers) and a name holding CR/LF reached the log as two lines.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import psutil
import pytest
from harness import Backend, make_repository, module_backend
from net import http_json
from tritonclient.grpc import service_pb2, service_pb2_grpc

MIB = 1 << 20
BAD_NAMES = ["evil\r\nFAKE LOG LINE", "tab\there", "nul\0byte", "bell\x07", "sep\u2028arator", "x" * 256]


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("names"), "identity_fp32")
    flags = ["--model-control-mode=explicit", "--load-model=identity_fp32"]
    with module_backend(Backend(repository, *flags)) as server:
        yield server


@pytest.fixture
def stub(backend: Backend) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    unlimited = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    channel = grpc.insecure_channel(f"127.0.0.1:{backend.ports['grpc']}", options=unlimited)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def http(backend: Backend, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    status, reply = http_json(f"http://{backend.http_url}", method, path,
                              None if body is None else json.dumps(body).encode())
    return status, reply if reply is not None else {}


def _code(call: Any, request: Any) -> grpc.StatusCode:
    try:
        call(request, timeout=60)
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


INFER = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}
HTTP_CALLS = [("POST", "/v2/repository/models/{}/load", {}), ("POST", "/v2/repository/models/{}/unload", {}),
              ("POST", "/v2/models/{}/infer", INFER), ("POST", "/v2/models/{}/versions/1/infer", INFER),
              ("POST", "/v2/models/{}/generate", {"text_input": "x"}), ("GET", "/v2/models/{}", None),
              ("GET", "/v2/models/{}/config", None), ("GET", "/v2/models/{}/stats", None),
              ("POST", "/v2/pystub/stubs/{}/restart", None)]


@pytest.mark.parametrize("name", BAD_NAMES, ids=ascii)
@pytest.mark.parametrize("method, path, body", HTTP_CALLS, ids=[path for _, path, _ in HTTP_CALLS])
def test_http_refuses_names_no_model_can_have(backend: Backend, name: str, method: str, path: str,
                                              body: Any) -> None:
    status, reply = http(backend, method, path.format(urllib.parse.quote(name, safe="")), body)
    assert status == 400, (status, reply)
    assert "invalid model name" in reply["error"], reply
    assert not any(c in reply["error"] for c in "\r\n\t\0\x07\u2028"), reply  # escaped, not raw


@pytest.mark.parametrize("name", BAD_NAMES, ids=ascii)
def test_grpc_refuses_names_no_model_can_have(stub: service_pb2_grpc.GRPCInferenceServiceStub, name: str) -> None:
    calls = {
        "load": (stub.RepositoryModelLoad, service_pb2.RepositoryModelLoadRequest(model_name=name)),
        "unload": (stub.RepositoryModelUnload, service_pb2.RepositoryModelUnloadRequest(model_name=name)),
        "infer": (stub.ModelInfer, service_pb2.ModelInferRequest(model_name=name)),
        "metadata": (stub.ModelMetadata, service_pb2.ModelMetadataRequest(name=name)),
        "config": (stub.ModelConfig, service_pb2.ModelConfigRequest(name=name)),
        "statistics": (stub.ModelStatistics, service_pb2.ModelStatisticsRequest(name=name)),
    }
    codes = {what: _code(call, request) for what, (call, request) in calls.items()}
    assert codes == dict.fromkeys(calls, grpc.StatusCode.INVALID_ARGUMENT), codes


def test_a_control_character_never_splits_a_log_line(backend: Backend) -> None:
    for path in ("/v2/repository/models/{}/load", "/v2/repository/models/{}/unload"):
        http(backend, "POST", path.format(urllib.parse.quote("evil\r\nFAKE LOG LINE", safe="")), {})
    assert not [line for line in backend.log().splitlines() if line.startswith("FAKE LOG LINE")]


def _index_names(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> set[str]:
    return {model.name for model in stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(), timeout=60).models}


def test_unknown_names_leave_no_index_rows(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    before = _index_names(stub)
    for i in range(200):
        name = f"unknown_{i:04d}_" + "n" * 200
        assert _code(stub.RepositoryModelLoad, service_pb2.RepositoryModelLoadRequest(model_name=name)) != \
            grpc.StatusCode.OK
        assert _code(stub.RepositoryModelUnload, service_pb2.RepositoryModelUnloadRequest(model_name=name)) == \
            grpc.StatusCode.OK
    assert _index_names(stub) == before


def test_unknown_one_mib_names_do_not_grow_the_backend(backend: Backend,
                                                       stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    def churn(first: int, loads: int, unloads: int) -> set[grpc.StatusCode]:
        codes = set()
        for i in range(first, first + loads):
            name = f"{i:04d}" + "m" * MIB
            codes.add(_code(stub.RepositoryModelLoad, service_pb2.RepositoryModelLoadRequest(model_name=name)))
        for i in range(first + loads, first + loads + unloads):
            name = f"{i:04d}" + "m" * MIB
            codes.add(_code(stub.RepositoryModelUnload, service_pb2.RepositoryModelUnloadRequest(model_name=name)))
        return codes

    churn(9000, 3, 3)  # the paths' own first-use allocations
    process = psutil.Process(backend.pid)
    before = process.memory_info().rss
    assert churn(0, 40, 30) == {grpc.StatusCode.INVALID_ARGUMENT}
    growth = process.memory_info().rss - before
    # Before the fix: about 115 MiB (each name kept twice over); the bound leaves room for the
    # allocator keeping freed request buffers.
    assert growth < 24 * MIB, f"the backend grew {growth / MIB:.1f} MiB"
