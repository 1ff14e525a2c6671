"""The access policy of state-changing calls (issue 18 item 2; frontends/access.py), against real
backends and real peers.

The backend binds 0.0.0.0 and the client connects to a non-loopback address of this machine, so the
backend's peer is that address (not 127.0.0.1): the same socket path a remote client takes, without
leaving the machine. Machines with no such address skip (the unit-level checks of the decision are in
tests/unit/backend/frontends/test_access.py).

- By default, load/unload, shm register/unregister, logging updates and stub restarts from that peer
  are refused (HTTP 403, gRPC PERMISSION_DENIED) and change nothing; reads and inference pass.
- The same calls from loopback pass.
- A group protected by --http-restricted-api / --grpc-restricted-protocol accepts the peer that
  carries the key; --allow-remote-control opens a group without a key.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from harness import Backend, make_repository, module_backend
from net import http_json, non_loopback_ipv4
from tritonclient.grpc import service_pb2, service_pb2_grpc

REMOTE = non_loopback_ipv4()
pytestmark = pytest.mark.skipif(REMOTE is None, reason="this machine has no non-loopback IPv4 address to be a "
                                                       "real non-loopback peer from")
REGISTER = {"key": "pystub_access_probe", "offset": 0, "byte_size": 64}


def http(host: str, port: int, method: str, path: str, body: Any = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    return http_json(f"http://{host}:{port}", method, path, data, headers)


def _grpc_code(stub: service_pb2_grpc.GRPCInferenceServiceStub, method: str, request: Any,
               metadata: tuple[tuple[str, str], ...] = ()) -> grpc.StatusCode:
    try:
        getattr(stub, method)(request, timeout=30, metadata=metadata)
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("access"), "identity_fp32")
    flags = ["--model-control-mode=explicit", "--load-model=identity_fp32", "--http-address=0.0.0.0",
             "--grpc-address=0.0.0.0", "--allow-client-shm=true"]
    with module_backend(Backend(repository, *flags)) as server:
        yield server


STATE_CHANGING_HTTP = [
    ("POST", "/v2/repository/models/identity_fp32/load", {}),
    ("POST", "/v2/repository/models/identity_fp32/unload", {}),
    ("POST", "/v2/repository/models/anything/load", {"parameters": {"config": "{}", "file:1/model.py": "eA=="}}),
    ("POST", "/v2/systemsharedmemory/region/probe/register", REGISTER),
    ("POST", "/v2/systemsharedmemory/unregister", {}),
    ("POST", "/v2/systemsharedmemory/region/probe/unregister", {}),
    ("POST", "/v2/logging", {"log_verbose_level": 3}),
    ("POST", "/v2/pystub/stubs/identity_fp32/restart", None),
]


@pytest.mark.parametrize("method, path, body", STATE_CHANGING_HTTP, ids=[p for _, p, _ in STATE_CHANGING_HTTP])
def test_http_state_changes_are_refused_from_a_non_loopback_peer(backend: Backend, method: str, path: str,
                                                                  body: Any) -> None:
    pids = sorted(p.pid for p in backend.stub_processes())
    status, reply = http(REMOTE, backend.ports["http"], method, path, body)
    assert status == 403, (status, reply)
    assert f"not from '{REMOTE}'" in reply["error"] and "--allow-remote-control" in reply["error"], reply
    assert sorted(p.pid for p in backend.stub_processes()) == pids, "a refused call must change nothing"
    assert http("127.0.0.1", backend.ports["http"], "GET", "/v2/logging")[1]["log_verbose_level"] == 0
    assert http("127.0.0.1", backend.ports["http"], "GET", "/v2/models/identity_fp32/ready")[0] == 200


def test_http_reads_and_inference_pass_from_a_non_loopback_peer(backend: Backend) -> None:
    port = backend.ports["http"]
    assert http(REMOTE, port, "GET", "/v2/logging")[0] == 200
    assert http(REMOTE, port, "POST", "/v2/repository/index", {})[0] == 200
    assert http(REMOTE, port, "GET", "/v2/systemsharedmemory/status")[0] == 200
    assert http(REMOTE, port, "GET", "/v2/pystub/stubs")[0] == 200
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    status, reply = http(REMOTE, port, "POST", "/v2/models/identity_fp32/infer", body)
    assert status == 200 and reply["outputs"][0]["data"] == [1, 2, 3, 4], reply


def test_http_state_changes_pass_from_loopback(backend: Backend) -> None:
    port = backend.ports["http"]
    assert http("127.0.0.1", port, "POST", "/v2/repository/models/never_there/unload", {})[0] == 200
    status, reply = http("127.0.0.1", port, "POST", "/v2/logging", {"log_verbose_level": 0})
    assert status == 200 and reply["log_verbose_level"] == 0, reply
    assert http("127.0.0.1", port, "POST", "/v2/pystub/stubs/never_there/restart")[0] == 404  # let through


def test_grpc_state_changes_are_refused_from_a_non_loopback_peer(backend: Backend) -> None:
    channel = grpc.insecure_channel(f"{REMOTE}:{backend.ports['grpc']}")
    try:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        refused = {
            "RepositoryModelLoad": service_pb2.RepositoryModelLoadRequest(model_name="identity_fp32"),
            "RepositoryModelUnload": service_pb2.RepositoryModelUnloadRequest(model_name="identity_fp32"),
            "SystemSharedMemoryRegister": service_pb2.SystemSharedMemoryRegisterRequest(
                name="probe", key=REGISTER["key"], byte_size=64),
            "SystemSharedMemoryUnregister": service_pb2.SystemSharedMemoryUnregisterRequest(),
            "LogSettings": service_pb2.LogSettingsRequest(
                settings={"log_verbose_level": service_pb2.LogSettingsRequest.SettingValue(uint32_param=3)}),
        }
        codes = {method: _grpc_code(stub, method, request) for method, request in refused.items()}
        assert codes == dict.fromkeys(refused, grpc.StatusCode.PERMISSION_DENIED), codes
        try:
            stub.RepositoryModelUnload(refused["RepositoryModelUnload"], timeout=30)
        except grpc.RpcError as error:
            assert f"not from '{REMOTE}'" in (error.details() or ""), error.details()
        assert _grpc_code(stub, "LogSettings", service_pb2.LogSettingsRequest()) == grpc.StatusCode.OK  # a read
        assert _grpc_code(stub, "RepositoryIndex", service_pb2.RepositoryIndexRequest()) == grpc.StatusCode.OK
    finally:
        channel.close()
    client = grpcclient.InferenceServerClient(f"{REMOTE}:{backend.ports['grpc']}")
    try:
        data = np.arange(4, dtype=np.float32).reshape(1, 4)
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(data)
        assert np.array_equal(client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0"), data)
        assert client.is_model_ready("identity_fp32")
        assert client.get_log_settings(as_json=True)["settings"]["log_verbose_level"]["uint32_param"] == 0
    finally:
        client.close()


def test_grpc_state_changes_pass_from_loopback(backend: Backend) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{backend.ports['grpc']}")
    try:
        client.unload_model("never_there")
        client.update_log_settings({"log_verbose_level": 0})
    finally:
        client.close()


def test_a_key_or_the_open_flag_lets_a_non_loopback_peer_change_state(tmp_path: Any) -> None:
    repository = make_repository(tmp_path, "identity_fp32")
    flags = ["--model-control-mode=explicit", "--http-address=0.0.0.0", "--grpc-address=0.0.0.0",
             "--http-restricted-api=model-repository:admin-key=s3cret",
             "--grpc-restricted-protocol=model-repository:admin-key=s3cret", "--allow-remote-control=logging"]
    with Backend(repository, *flags) as server:
        port, path = server.ports["http"], "/v2/repository/models/identity_fp32/load"
        assert http(REMOTE, port, "POST", path, {})[0] == 403  # the key is missing
        status, reply = http(REMOTE, port, "POST", path, {}, {"admin-key": "s3cret"})
        assert status == 200, reply
        assert http(REMOTE, port, "GET", "/v2/models/identity_fp32/ready")[0] == 200
        status, reply = http(REMOTE, port, "POST", "/v2/logging", {"log_verbose_level": 0})  # opened
        assert status == 200, reply
        status, reply = http(REMOTE, port, "POST", "/v2/systemsharedmemory/unregister", {})  # neither
        assert status == 403 and f"not from '{REMOTE}'" in reply["error"], reply
        channel = grpc.insecure_channel(f"{REMOTE}:{server.ports['grpc']}")
        try:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            unload = service_pb2.RepositoryModelUnloadRequest(model_name="identity_fp32")
            key = (("triton-grpc-protocol-admin-key", "s3cret"),)
            assert _grpc_code(stub, "RepositoryModelUnload", unload) == grpc.StatusCode.UNAVAILABLE  # no key
            assert _grpc_code(stub, "RepositoryModelUnload", unload, key) == grpc.StatusCode.OK
            update = service_pb2.LogSettingsRequest(
                settings={"log_verbose_level": service_pb2.LogSettingsRequest.SettingValue(uint32_param=0)})
            assert _grpc_code(stub, "LogSettings", update) == grpc.StatusCode.OK
            shm = service_pb2.SystemSharedMemoryUnregisterRequest()
            assert _grpc_code(stub, "SystemSharedMemoryUnregister", shm) == grpc.StatusCode.PERMISSION_DENIED
        finally:
            channel.close()
        assert http(REMOTE, port, "GET", "/v2/models/identity_fp32/ready")[0] == 400  # unloaded over gRPC
