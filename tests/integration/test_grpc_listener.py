"""The gRPC listener's flags and services with a real backend and real clients: health
(`grpc.health.v1`), reflection, TLS (server and mutual), restricted protocol groups, connection age,
SO_REUSEPORT, and one response per request of a non-decoupled model on the stream."""

from __future__ import annotations

import queue
import socket
import subprocess
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from harness import Backend, assert_busy_port_refused, make_repository
from tritonclient.utils import InferenceServerException

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
_DEADLINE = 30.0


def _health(channel: grpc.Channel, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=_DEADLINE).status


def test_health_check_and_watch_follow_readiness(tmp_path: Path) -> None:
    repository = make_repository(tmp_path, "add_sub", "init_raises")
    with Backend(repository, "--model-control-mode=explicit", "--load-model=add_sub") as backend, \
            grpc.insecure_channel(backend.grpc_url) as channel:
        assert _health(channel) == SERVING
        assert _health(channel, "inference.GRPCInferenceService") == SERVING
        assert _health(channel, "no.such.Service") == SERVING  # as tritonserver 2.51: any name, the server's status
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=_DEADLINE)
        assert next(watch).status == SERVING
        client = grpcclient.InferenceServerClient(backend.grpc_url)
        try:
            with pytest.raises(InferenceServerException):
                client.load_model("init_raises")  # a failed model makes the server unready
            assert not client.is_server_ready()
            assert next(watch).status == NOT_SERVING
            assert _health(channel) == NOT_SERVING
            client.unload_model("init_raises")
            assert next(watch).status == SERVING
        finally:
            client.close()
        # Read the watch while the server stops, not after it has exited: a message the client has
        # not read yet can be lost with the connection once the server process is gone.
        heard: list[int] = []
        reader = threading.Thread(target=lambda: heard.extend(response.status for response in watch))
        reader.start()
        backend.stop()  # shutdown: watchers hear NOT_SERVING and their stream ends
        reader.join(timeout=_DEADLINE)
        assert not reader.is_alive(), "the health watch did not end at shutdown"
        assert heard == [NOT_SERVING]


def test_reflection_lists_the_services(examples_backend: Backend) -> None:
    with grpc.insecure_channel(examples_backend.grpc_url) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        response = next(stub.ServerReflectionInfo(iter([request]), timeout=_DEADLINE))
        names = {service.name for service in response.list_services_response.service}
        assert {"inference.GRPCInferenceService", "grpc.health.v1.Health",
                "grpc.reflection.v1alpha.ServerReflection"} <= names
        request = reflection_pb2.ServerReflectionRequest(file_containing_symbol="inference.GRPCInferenceService")
        response = next(stub.ServerReflectionInfo(iter([request]), timeout=_DEADLINE))
        assert response.file_descriptor_response.file_descriptor_proto


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _certificates(directory: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by the CA."""
    files = {name: directory / f"{name}" for name in ("ca.key", "ca.crt", "server.key", "server.crt",
                                                         "client.key", "client.crt", "ext.cnf")}
    files["ext.cnf"].write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
             "-keyout", str(files["ca.key"]), "-out", str(files["ca.crt"]))
    for who in ("server", "client"):
        csr = directory / f"{who}.csr"
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={who}", "-keyout", str(files[f"{who}.key"]),
                 "-out", str(csr))
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(files["ca.crt"]), "-CAkey", str(files["ca.key"]),
                 "-CAcreateserial", "-days", "1", "-extfile", str(files["ext.cnf"]), "-out", str(files[f"{who}.crt"]))
    return files


def _tls_client(backend: Backend, files: dict[str, Path], with_client_cert: bool) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(
        backend.grpc_url, ssl=True, root_certificates=str(files["ca.crt"]),
        private_key=str(files["client.key"]) if with_client_cert else None,
        certificate_chain=str(files["client.crt"]) if with_client_cert else None)


def test_tls_and_mutual_tls(tmp_path: Path) -> None:
    files = _certificates(tmp_path)
    tls = [f"--grpc-server-cert={files['server.crt']}", f"--grpc-server-key={files['server.key']}"]
    repository = make_repository(tmp_path, "add_sub")
    with Backend(repository, "--grpc-use-ssl=true", *tls) as backend:
        client = _tls_client(backend, files, with_client_cert=False)
        plain = grpcclient.InferenceServerClient(backend.grpc_url)
        try:
            assert client.is_server_ready() and client.get_model_metadata("add_sub").name == "add_sub"
            with pytest.raises(InferenceServerException):  # plaintext does not talk to a TLS port
                plain.is_server_live(client_timeout=5)
        finally:
            client.close()
            plain.close()
    with Backend(repository, "--grpc-use-ssl-mutual=true", f"--grpc-root-cert={files['ca.crt']}", *tls) as backend:
        with_cert = _tls_client(backend, files, with_client_cert=True)
        without = _tls_client(backend, files, with_client_cert=False)
        try:
            assert with_cert.is_server_ready()
            with pytest.raises(InferenceServerException):  # no client certificate: handshake refused
                without.is_server_live(client_timeout=5)
        finally:
            with_cert.close()
            without.close()


def test_restricted_protocol_groups(tmp_path: Path) -> None:
    repository = make_repository(tmp_path, "add_sub")
    with Backend(repository, "--grpc-restricted-protocol=model-repository,inference:admin-key=s3cret") as backend:
        client = grpcclient.InferenceServerClient(backend.grpc_url)
        try:
            assert client.is_server_ready()  # health is open
            assert client.get_model_metadata("add_sub").name == "add_sub"  # metadata is open
            for call in (lambda **kw: client.get_model_repository_index(**kw),
                         lambda **kw: client.infer("add_sub", _add_sub_inputs(), **kw)):
                with pytest.raises(InferenceServerException) as info:
                    call()
                assert info.value.status() == "StatusCode.UNAVAILABLE"
                # Triton's text and metadata key (checked against tritonserver 2.51)
                assert info.value.message() == "This protocol is restricted, expecting header " \
                                               "'triton-grpc-protocol-admin-key'"
                for wrong in ({"triton-grpc-protocol-admin-key": "wrong"}, {"admin-key": "s3cret"}):
                    with pytest.raises(InferenceServerException):
                        call(headers=wrong)
                assert call(headers={"triton-grpc-protocol-admin-key": "s3cret"}) is not None
        finally:
            client.close()


def _add_sub_inputs() -> list[grpcclient.InferInput]:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
        inputs.append(tensor)
    return inputs


def _slow_call(backend: Backend, delay_ms: int) -> None:
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        tensor = grpcclient.InferInput("DELAY_MS", [1], "INT32")
        tensor.set_data_from_numpy(np.array([delay_ms], np.int32))
        client.infer("slow", [tensor], client_timeout=_DEADLINE)
    finally:
        client.close()


def test_max_connection_age_ends_long_calls(tmp_path: Path) -> None:
    repository = make_repository(tmp_path, "slow")
    with Backend(repository, "--grpc-max-connection-age=200", "--grpc-max-connection-age-grace=200") as backend:
        _slow_call(backend, 50)  # well inside the age: served
        with pytest.raises(InferenceServerException) as info:
            _slow_call(backend, 3000)  # outlives age + grace: the server closes the connection
        assert info.value.status() == "StatusCode.UNAVAILABLE", info.value
    with Backend(repository) as backend:  # without the flag the same call is served
        _slow_call(backend, 1000)


def test_reuse_grpc_port(tmp_path: Path) -> None:
    repository = make_repository(tmp_path, "add_sub")
    with Backend(repository, "--reuse-grpc-port=true") as first:
        port = str(first.ports["grpc"])
        second = Backend(repository, "--reuse-grpc-port=true")
        second.args += ["--grpc-port", port]
        with second:
            assert second.ports["grpc"] == first.ports["grpc"]
        assert_busy_port_refused(repository, "grpc", first.ports["grpc"])


@pytest.mark.parametrize("empty_final", [False, True])
def test_stream_gives_one_response_per_request_of_a_default_model(examples_backend: Backend, empty_final: bool) -> None:
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(examples_backend.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        for index in range(5):
            tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
            tensor.set_data_from_numpy(np.full((1, 3), index, np.float32))
            client.async_stream_infer("identity_fp32", [tensor], request_id=str(index),
                                      enable_empty_final_response=empty_final)
        client.stop_stream()  # waits until the server has closed the stream: every response is in
    finally:
        client.close()
    received = [responses.get_nowait() for _ in range(responses.qsize())]
    assert [error for _, error in received] == [None] * 5
    assert [result.get_response().id for result, _ in received] == ["0", "1", "2", "3", "4"]
    for index, (result, _) in enumerate(received):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 3), index, np.float32))
        assert result.get_response().parameters["triton_final_response"].bool_param is True


class _CountingProxy:
    """A TCP proxy on 127.0.0.1 that counts the bytes the server sends back."""

    def __init__(self, target_port: int) -> None:
        self._target = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.received = 0
        self._sockets: list[socket.socket] = [self._listener]
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except OSError:
            return
        server = socket.create_connection(("127.0.0.1", self._target), timeout=_DEADLINE)
        self._sockets += [client, server]
        for source, sink, counted in ((client, server, False), (server, client, True)):
            thread = threading.Thread(target=self._pump, args=(source, sink, counted), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _pump(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        try:
            while data := source.recv(65536):
                if counted:
                    self.received += len(data)
                sink.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        for sock in self._sockets:
            try:  # wakes the threads blocked in accept/recv (close alone does not)
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        for thread in self._threads:
            thread.join(timeout=_DEADLINE)


def _bytes_for_zeros(backend: Backend) -> int:
    proxy = _CountingProxy(backend.ports["grpc"])
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{proxy.port}")
    try:
        tensor = grpcclient.InferInput("INPUT0", [1, 256 * 1024], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 256 * 1024), np.float32))  # 1 MiB, very compressible
        result = client.infer("identity_fp32", [tensor], client_timeout=_DEADLINE)
        assert not result.as_numpy("OUTPUT0").any()
    finally:
        client.close()
        proxy.close()
    return proxy.received


def test_response_compression_level(tmp_path: Path) -> None:
    repository = make_repository(tmp_path, "identity_fp32")
    with Backend(repository) as backend:
        plain = _bytes_for_zeros(backend)
    with Backend(repository, "--grpc-infer-response-compression-level=high") as backend:
        compressed = _bytes_for_zeros(backend)
    assert plain > 2**20 and compressed < plain // 10, (plain, compressed)
