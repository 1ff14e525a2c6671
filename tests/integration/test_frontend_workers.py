"""`--frontend-workers N` against a real backend, real workers and real clients.

The workers serve the public ports (SO_REUSEPORT); inference is decoded in a worker and run in the
core over the core link; every other call goes through the workers' proxies to the core's full
HTTP app and gRPC server on private sockets. Shown here:

- inference over HTTP binary, HTTP JSON and gRPC answers the right values, and new connections
  land on more than one worker (the workers' access lines carry their pids);
- metadata, config, ready, statistics, repository load/unload, client shm registration and a
  decoupled model's gRPC stream all work through the proxies;
- errors of bad requests have the in-process server's status and text (a second backend without
  workers answers the same requests);
- a state-changing call from a non-loopback peer is refused even when the client claims, in the
  internal peer header, to be loopback; the same call from loopback passes;
- a killed worker is started again and serving resumes; shutdown leaves no worker and no socket
  directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from harness import LONG_LIVED_FDS, LONG_LIVED_PIDS, Backend, make_repository, module_backend
from net import http_json, non_loopback_ipv4
from tritonclient.grpc import service_pb2, service_pb2_grpc

MODELS = ("add_sub", "identity_fp32", "repeat")
WORKERS = 2
INTERNAL_PEER = "x-pystub-internal-peer"


REMOTE = non_loopback_ipv4()


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repository(tmp_path_factory.mktemp("workers"), *MODELS)


def _flags(*extra: str) -> list[str]:
    return ["--model-control-mode=explicit", *(f"--load-model={name}" for name in MODELS), "--allow-client-shm=true",
            "--http-address=0.0.0.0", "--grpc-address=0.0.0.0", "--log-verbose=1", *extra]


@pytest.fixture(scope="module")
def backend(repository: Path) -> Iterator[Backend]:
    from multiprocessing import resource_tracker  # tritonclient's shm helpers start it: long-lived

    resource_tracker.ensure_running()
    tracker = resource_tracker._resource_tracker  # noqa: SLF001 - no public way to learn its pid/fd
    LONG_LIVED_PIDS.update({tracker._pid} if tracker._pid is not None else set())
    LONG_LIVED_FDS.update({tracker._fd} if tracker._fd is not None else set())
    with module_backend(Backend(repository, *_flags(f"--frontend-workers={WORKERS}"))) as server:
        yield server


@pytest.fixture(scope="module")
def in_process(repository: Path) -> Iterator[Backend]:
    """The same repository served without workers: the reference for error statuses and texts."""
    with module_backend(Backend(repository, *_flags())) as server:
        yield server


def workers(backend: Backend) -> list[psutil.Process]:
    return [child for child in psutil.Process(backend.pid).children()
            if "pystub_backend.backend.frontends.workers.worker" in " ".join(child.cmdline())]


def http(port: int, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
         host: str = "127.0.0.1") -> tuple[int, Any]:
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    return http_json(f"http://{host}:{port}", method, path, data, headers)


def _add_sub_inputs(module: Any, binary: bool = True) -> tuple[list[Any], np.ndarray, np.ndarray]:
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 2.0, dtype=np.float32)
    inputs = [module.InferInput("INPUT0", [4], "FP32"), module.InferInput("INPUT1", [4], "FP32")]
    if module is httpclient:
        inputs[0].set_data_from_numpy(a, binary_data=binary)
        inputs[1].set_data_from_numpy(b, binary_data=binary)
    else:
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
    return inputs, a, b


def test_inference_over_http_binary_json_and_grpc(backend: Backend) -> None:
    client = httpclient.InferenceServerClient(backend.http_url)
    inputs, a, b = _add_sub_inputs(httpclient)
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    inputs, a, b = _add_sub_inputs(httpclient, binary=False)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)]
    result = client.infer("add_sub", inputs, outputs=outputs, request_id="json-1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    assert result.get_response()["id"] == "json-1"
    client.close()
    grpc_client = grpcclient.InferenceServerClient(backend.grpc_url)
    inputs, a, b = _add_sub_inputs(grpcclient)
    result = grpc_client.infer("add_sub", inputs, request_id="grpc-1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response().id == "grpc-1"
    grpc_client.close()


def _access_pids(log: str) -> set[int]:
    """Pids of the processes that logged an HTTP inference access line."""
    line = re.compile(r"^\S+ \S+ (\d+) access_log\.py:\d+\] HTTP POST /v2/models/add_sub/infer", re.MULTILINE)
    return {int(match.group(1)) for match in line.finditer(log)}


def test_connections_are_spread_over_the_workers(backend: Backend) -> None:
    for _ in range(40):  # a new connection each time: the kernel picks a worker per connection
        status, _ = http(backend.ports["http"], "POST", "/v2/models/add_sub/infer", {"inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]},
            {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [2, 2, 2, 2]}]})
        assert status == 200
    serving = _access_pids(backend.log())
    assert len(serving) >= 2, serving
    assert serving <= {process.pid for process in workers(backend)}, "inference must be served by the workers"
    assert backend.pid not in serving


def test_metadata_config_ready_statistics_through_the_proxy(backend: Backend) -> None:
    port = backend.ports["http"]
    assert http(port, "GET", "/v2/health/ready")[0] == 200
    assert http(port, "GET", "/v2/models/add_sub/ready")[0] == 200
    status, metadata = http(port, "GET", "/v2/models/add_sub")
    assert status == 200 and [i["name"] for i in metadata["inputs"]] == ["INPUT0", "INPUT1"]
    status, config = http(port, "GET", "/v2/models/add_sub/config")
    assert status == 200 and config["name"] == "add_sub"
    http(port, "POST", "/v2/models/identity_fp32/infer",
         {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]})
    status, stats = http(port, "GET", "/v2/models/identity_fp32/stats")
    assert status == 200 and stats["model_stats"][0]["inference_stats"]["success"]["count"] >= 1
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    assert client.is_server_live() and client.is_model_ready("add_sub")
    assert client.get_model_config("add_sub").config.name == "add_sub"
    assert client.get_model_metadata("identity_fp32").inputs[0].name == "INPUT0"
    assert client.get_inference_statistics("identity_fp32").model_stats[0].inference_stats.success.count >= 1
    client.close()


def test_repository_load_and_unload_through_the_proxy(backend: Backend) -> None:
    client = httpclient.InferenceServerClient(backend.http_url)
    client.unload_model("identity_fp32")
    assert not client.is_model_ready("identity_fp32")
    grpc_client = grpcclient.InferenceServerClient(backend.grpc_url)
    grpc_client.load_model("identity_fp32")
    assert client.is_model_ready("identity_fp32")
    index = {entry["name"]: entry["state"] for entry in client.get_model_repository_index()}
    assert index["identity_fp32"] == "READY", index
    client.close()
    grpc_client.close()


def test_client_shm_registration_and_inference(backend: Backend) -> None:
    key = f"/workers_probe_{os.getpid()}"  # not pystub-prefixed: those are the server's own
    region = shm.create_shared_memory_region("workers_in", key, 64)
    try:
        data = np.arange(16, dtype=np.float32).reshape(1, 16)
        shm.set_shared_memory_region(region, [data])
        client = httpclient.InferenceServerClient(backend.http_url)
        client.register_system_shared_memory("workers_in", key, 64)
        assert client.get_system_shared_memory_status()[0]["name"] == "workers_in"
        tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_shared_memory("workers_in", 64)
        np.testing.assert_array_equal(client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0"), data)
        client.unregister_system_shared_memory("workers_in")
        grpc_client = grpcclient.InferenceServerClient(backend.grpc_url)
        grpc_client.register_system_shared_memory("workers_in", key, 64)
        assert [r.name for r in grpc_client.get_system_shared_memory_status().regions.values()] == ["workers_in"]
        grpc_client.unregister_system_shared_memory("workers_in")
        client.close()
        grpc_client.close()
    finally:
        shm.destroy_shared_memory_region(region)


def test_decoupled_stream_over_grpc_and_refusal_on_unary(backend: Backend, in_process: Backend) -> None:
    import queue

    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    count = grpcclient.InferInput("COUNT", [1], "INT32")
    count.set_data_from_numpy(np.array([3], dtype=np.int32))
    delay = grpcclient.InferInput("DELAY_MS", [1], "INT32")
    delay.set_data_from_numpy(np.array([5], dtype=np.int32))
    client.async_stream_infer("repeat", [count, delay])
    values = [int(answers.get(timeout=30).as_numpy("OUT")[0]) for _ in range(3)]
    client.stop_stream()
    client.close()
    assert values == [0, 1, 2]
    for server in (backend, in_process):  # the core's decoupled check, with the frontends' texts
        status, reply = http(server.ports["http"], "POST", "/v2/models/repeat/infer", {"inputs": []})
        assert (status, reply["error"]) == (501, "HTTP end point doesn't support models with decoupled "
                                                 "transaction policy")
    codes = [_grpc_error(server, "repeat") for server in (backend, in_process)]
    assert codes[0] == codes[1] == (grpc.StatusCode.UNIMPLEMENTED,
                                    "ModelInfer RPC doesn't support models with decoupled transaction policy")


def _grpc_error(server: Backend, model: str) -> tuple[grpc.StatusCode, str]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            stub.ModelInfer(service_pb2.ModelInferRequest(model_name=model), timeout=30)
        except grpc.RpcError as error:
            return error.code(), error.details()
    raise AssertionError("the call succeeded")


BAD_REQUESTS = [
    ("POST", "/v2/models/nope/infer", {"inputs": []}, {}),
    ("POST", "/v2/models/add_sub/infer", {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1]}]},
     {}),
    ("POST", "/v2/models/add_sub/infer", b"{not json", {}),
    ("POST", "/v2/models/add_sub/infer", {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2],
                                                      "data": [1]}]}, {}),
    ("POST", "/v2/models/add_sub/infer", b"\x00\x00\x00\x00", {"Inference-Header-Content-Length": "0"}),
    ("GET", "/v2/models/nope", None, {}),
    ("GET", "/v2/models/add_sub/infer", None, {}),
    ("GET", "/v2/nothing/here", None, {}),
]


@pytest.mark.parametrize("method, path, body, headers", BAD_REQUESTS, ids=[str(i) for i in range(len(BAD_REQUESTS))])
def test_error_texts_equal_the_in_process_servers(backend: Backend, in_process: Backend, method: str, path: str,
                                                  body: Any, headers: dict[str, str]) -> None:
    answers = [http(server.ports["http"], method, path, body, headers) for server in (backend, in_process)]
    assert answers[0] == answers[1]
    assert answers[0][0] >= 400, answers


def test_grpc_error_texts_equal_the_in_process_servers(backend: Backend, in_process: Backend) -> None:
    assert _grpc_error(backend, "nope") == _grpc_error(in_process, "nope")
    assert _grpc_error(backend, "add_sub") == _grpc_error(in_process, "add_sub")


@pytest.mark.skipif(REMOTE is None, reason="this machine has no non-loopback IPv4 address")
def test_state_changes_from_a_non_loopback_peer_are_refused_even_when_it_claims_loopback(backend: Backend) -> None:
    assert REMOTE is not None
    port = backend.ports["http"]
    for headers in ({}, {INTERNAL_PEER: "127.0.0.1"}):
        status, reply = http(port, "POST", "/v2/repository/models/identity_fp32/unload", {}, headers, host=REMOTE)
        assert status == 403 and f"not from '{REMOTE}'" in reply["error"], reply
    assert http(port, "GET", "/v2/models/identity_fp32/ready")[0] == 200
    with grpc.insecure_channel(f"{REMOTE}:{backend.ports['grpc']}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for metadata in ((), ((INTERNAL_PEER, "127.0.0.1"),)):
            with pytest.raises(grpc.RpcError) as error:
                stub.RepositoryModelUnload(service_pb2.RepositoryModelUnloadRequest(model_name="identity_fp32"),
                                           timeout=30, metadata=metadata)
            assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert f"not from '{REMOTE}'" in error.value.details()
    status, reply = http(port, "POST", "/v2/logging", {"log_verbose_level": 1})  # loopback: passes
    assert status == 200 and reply["log_verbose_level"] == 1
    # The access lines name the real client, for the proxied gRPC call too (the core logs it).
    backend.wait_for_log(rf"HTTP POST /v2/repository/models/identity_fp32/unload 403 .* peer={re.escape(REMOTE)}\b")
    backend.wait_for_log(rf"gRPC RepositoryModelUnload .*PERMISSION_DENIED .* peer=ipv4:{re.escape(REMOTE)}:")


def test_a_killed_worker_is_started_again(backend: Backend) -> None:
    before = {process.pid for process in workers(backend)}
    assert len(before) == WORKERS
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    backend.wait_for_log(rf"frontend worker \d \(pid {victim}\) exited with status -9", timeout=30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = {process.pid for process in workers(backend)}
        if len(now) == WORKERS and victim not in now and re.search(
                rf"frontend worker \d \(pid {max(now - before, default=0)}\) serves", backend.log()):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"no new worker serves: {backend.log()[-3000:]}")
    for _ in range(10):
        client = httpclient.InferenceServerClient(backend.http_url)
        inputs, a, b = _add_sub_inputs(httpclient)
        np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + b)
        client.close()


def test_shutdown_leaves_no_worker_and_no_socket_directory(repository: Path) -> None:
    server = Backend(repository, *_flags("--frontend-workers=2")).start()
    try:
        pids = [process.pid for process in workers(server)]
        directories = {process.cmdline()[process.cmdline().index("--directory") + 1] for process in workers(server)}
        assert len(pids) == 2 and len(directories) == 1
        directory = Path(directories.pop())
        assert directory.is_dir() and (directory.stat().st_mode & 0o777) == 0o700
        assert sorted(entry.name for entry in directory.iterdir()) == ["core.sock", "grpc.sock", "http.sock"]
    finally:
        server.stop()
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)
    assert not directory.exists()


def test_workers_of_a_killed_core_exit_and_its_directory_is_swept(repository: Path) -> None:
    # Every server with workers sweeps dead servers' directories from its temporary directory at
    # start: a private one keeps the other servers on the machine from sweeping this core's first.
    private = Path(tempfile.mkdtemp(prefix="pystub-t-"))
    try:
        _kill_a_core_then_start_a_successor(repository, {"TMPDIR": str(private)})
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _kill_a_core_then_start_a_successor(repository: Path, env: dict[str, str]) -> None:
    server = Backend(repository, *_flags("--frontend-workers=1"), env=env).start()
    try:
        (worker,) = workers(server)
        directory = Path(worker.cmdline()[worker.cmdline().index("--directory") + 1])
        os.kill(server.pid, signal.SIGKILL)  # the core only: its workers lose the core link
        worker.wait(30)  # raises psutil.TimeoutExpired if the worker outlives its core
        assert directory.exists()  # nobody cleaned up...
    finally:
        server.stop(check=False)  # the rest of its process group (stubs)
    with Backend(repository, *_flags("--frontend-workers=1"), env=env) as successor:
        assert not directory.exists()  # ...until the next server swept it (its owner is dead)
        assert f"removed the frontend-worker directory {directory}" in successor.log()


def _wait_in_flight(server: Backend, count: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        rows = http(server.ports["http"], "GET", "/v2/pystub/stubs")[1]["stubs"]
        if sum(row["in_flight"] for row in rows) >= count:
            return
        assert time.monotonic() < deadline, f"not {count} requests in flight after 30 s: {rows}"
        time.sleep(0.02)


def test_shutdown_lets_in_flight_requests_finish(tmp_path: Path) -> None:
    import concurrent.futures

    repository = make_repository(tmp_path, "slow")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        server = Backend(repository, "--frontend-workers=2").start()
        try:
            body = {"inputs": [{"name": "DELAY_MS", "datatype": "INT32", "shape": [1], "data": [1500]}]}
            answer = pool.submit(http, server.ports["http"], "POST", "/v2/models/slow/infer", body)
            client = grpcclient.InferenceServerClient(server.grpc_url)
            tensor = grpcclient.InferInput("DELAY_MS", [1], "INT32")
            tensor.set_data_from_numpy(np.array([1500], dtype=np.int32))
            grpc_answer = pool.submit(client.infer, "slow", [tensor])
            _wait_in_flight(server, 2)  # both requests are in the model: SIGTERM must let them finish
            server.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            status, reply = answer.result(timeout=60)
            assert status == 200 and reply["outputs"][0]["data"] == [1500], reply
            assert grpc_answer.result(timeout=60).as_numpy("OUTPUT0").tolist() == [1500]
            client.close()
        finally:
            assert server.stop() == 0
