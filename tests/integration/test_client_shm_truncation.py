"""A client's shm region that its owner truncates, removes or replaces.

The backend never maps a client's object, so it cannot die of SIGBUS (before: a BYTES input in a
truncated region killed it with exit 135, taking every model down). What it reads, it reads with
preadv: a short read fails that request with INVALID_ARGUMENT. The stub checks the object's size
before using its mapping: a region that shrank before the request fails that request alone with
INVALID_ARGUMENT, the stub lives on. A region that shrinks while a model is reading it can still kill
the stub; the backend survives, the request fails, the stub is restarted and serves again.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import Backend, make_repository, module_backend
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

MODELS = ("identity_fp32", "string_identity", "slow")
_counter = iter(range(1_000_000))


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("shm_truncation"), *MODELS)
    with module_backend(Backend(repository, "--allow-client-shm=true")) as started:
        yield started


@pytest.fixture(params=("http", "grpc"))
def protocol(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture()
def tc(backend: Backend, protocol: str) -> Iterator[Any]:
    connection = (httpclient.InferenceServerClient(backend.http_url) if protocol == "http"
                  else grpcclient.InferenceServerClient(backend.grpc_url))
    try:
        yield connection
    finally:
        connection.unregister_system_shared_memory()
        connection.close()


@contextlib.contextmanager
def shm_object(data: bytes) -> Iterator[str]:
    """A client's object holding `data` (made with os.open, as any client may); yields its key."""
    key = f"/clientshm_trunc_{os.getpid()}_{next(_counter)}"
    fd = os.open("/dev/shm" + key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    try:
        yield key
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink("/dev/shm" + key)


def module_of(protocol: str) -> Any:
    return httpclient if protocol == "http" else grpcclient


def shm_input(protocol: str, name: str, shape: list[int], datatype: str, region: str, size: int) -> Any:
    tensor = module_of(protocol).InferInput(name, shape, datatype)
    tensor.set_shared_memory(region, size)
    return tensor


def shm_output(protocol: str, name: str, region: str, size: int) -> Any:
    output = module_of(protocol).InferRequestedOutput(name)
    output.set_shared_memory(region, size)
    return output


def stub_row(backend: Backend, model: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/pystub/stubs", timeout=30) as response:
        (row,) = [row for row in json.loads(response.read())["stubs"] if row["model"] == model]
    return row


def invalid_argument(call: Any, protocol: str) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()
    assert str(info.value.status()) == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"), info.value
    return info.value.message()


def assert_alive(backend: Backend) -> None:
    assert backend.process is not None and backend.process.poll() is None, "the backend died"
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/health/live", timeout=30) as response:
        assert response.status == 200


def test_truncated_fp32_input_fails_that_request_only(backend: Backend, tc: Any, protocol: str) -> None:
    data = np.arange(4096, dtype=np.float32).reshape(1, -1)
    restarts = stub_row(backend, "identity_fp32")["restarts"]
    with shm_object(data.tobytes()) as key:
        tc.register_system_shared_memory("in", key, data.nbytes)
        tensor = shm_input(protocol, "INPUT0", list(data.shape), "FP32", "in", data.nbytes)
        np.testing.assert_array_equal(tc.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0"), data)
        os.truncate("/dev/shm" + key, 0)  # the owner shrinks it under the registration
        text = invalid_argument(lambda: tc.infer("identity_fp32", [tensor]), protocol)
        assert "truncated" in text, text
        assert_alive(backend)
        row = stub_row(backend, "identity_fp32")
        assert row["restarts"] == restarts and row["healthy"] and row["in_flight"] == 0  # the stub lived
        os.truncate("/dev/shm" + key, data.nbytes)  # grown back: served again (zeros now)
        assert not tc.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0").any()


def test_truncated_bytes_input_fails_in_the_backend_without_killing_it(backend: Backend, tc: Any,
                                                                        protocol: str) -> None:
    """BYTES inputs are read by the backend (validation parses them): before, SIGBUS, exit 135."""
    strings = np.array([b"hello", b"shared", b"memory"] * 500, dtype=np.object_)
    payload = serialize_byte_tensor(strings).item()
    with shm_object(payload) as key:
        tc.register_system_shared_memory("in", key, len(payload))
        tensor = shm_input(protocol, "INPUT0", [strings.size], "BYTES", "in", len(payload))
        assert list(tc.infer("string_identity", [tensor]).as_numpy("OUTPUT0")) == list(strings)
        os.truncate("/dev/shm" + key, 16)
        text = invalid_argument(lambda: tc.infer("string_identity", [tensor]), protocol)
        assert "truncated" in text, text
        assert_alive(backend)


def test_truncated_output_region_fails_that_request_only(backend: Backend, tc: Any, protocol: str) -> None:
    data = np.arange(1024, dtype=np.float32).reshape(1, -1)
    restarts = stub_row(backend, "identity_fp32")["restarts"]
    with shm_object(bytes(data.nbytes)) as key:
        tc.register_system_shared_memory("out", key, data.nbytes)
        tensor = module_of(protocol).InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        output = shm_output(protocol, "OUTPUT0", "out", data.nbytes)
        tc.infer("identity_fp32", [tensor], outputs=[output])
        os.truncate("/dev/shm" + key, 0)
        text = invalid_argument(lambda: tc.infer("identity_fp32", [tensor], outputs=[output]), protocol)
        assert "truncated" in text, text
        assert_alive(backend)
        assert stub_row(backend, "identity_fp32")["restarts"] == restarts


def test_removed_or_replaced_region(backend: Backend, tc: Any, protocol: str) -> None:
    """Removed after registration: the backend still holds the old object, the stub cannot open
    it by name (INVALID_ARGUMENT). Replaced by a new object of the same name: refused."""
    strings = np.array([b"abc"] * 8, dtype=np.object_)
    payload = serialize_byte_tensor(strings).item()
    with shm_object(payload) as key:
        tc.register_system_shared_memory("in", key, len(payload))
        os.unlink("/dev/shm" + key)
        tensor = shm_input(protocol, "INPUT0", [strings.size], "BYTES", "in", len(payload))
        invalid_argument(lambda: tc.infer("string_identity", [tensor]), protocol)
        fd = os.open("/dev/shm" + key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)  # another object, same name
        os.write(fd, payload)
        os.close(fd)
        text = invalid_argument(lambda: tc.infer("string_identity", [tensor]), protocol)
        assert "replaced" in text, text
        assert_alive(backend)


def test_region_truncated_while_the_model_reads_it(backend: Backend, protocol: str) -> None:
    """The stub maps the region; shrunk while the model holds a view of it, the stub dies of
    SIGBUS when the output is copied. The backend survives, the request fails, the stub is
    restarted and serves the next request."""
    connection = (httpclient.InferenceServerClient(backend.http_url) if protocol == "http"
                  else grpcclient.InferenceServerClient(backend.grpc_url))
    delay = np.array([1500], dtype=np.int32)
    restarts = stub_row(backend, "slow")["restarts"]
    try:
        with shm_object(delay.tobytes() + bytes(8188)) as key:
            connection.register_system_shared_memory("in", key, 4)
            outcome: list[BaseException | None] = []

            def call() -> None:  # its own client: an HTTP tritonclient stays on the thread that made it
                worker = (httpclient.InferenceServerClient(backend.http_url) if protocol == "http"
                          else grpcclient.InferenceServerClient(backend.grpc_url))
                try:
                    worker.infer("slow", [shm_input(protocol, "DELAY_MS", [1], "INT32", "in", 4)])
                    outcome.append(None)
                except InferenceServerException as exc:
                    outcome.append(exc)
                finally:
                    worker.close()

            thread = threading.Thread(target=call)
            thread.start()
            deadline = time.monotonic() + 20
            while not stub_row(backend, "slow")["in_flight"]:
                assert time.monotonic() < deadline, "the request never reached the stub"
                time.sleep(0.02)
            time.sleep(0.3)  # the model has read DELAY_MS and sleeps with a view of the region
            os.truncate("/dev/shm" + key, 0)
            thread.join(60)
            assert not thread.is_alive()
            assert isinstance(outcome[0], InferenceServerException), outcome
            assert_alive(backend)
            deadline = time.monotonic() + 60
            while not ((row := stub_row(backend, "slow"))["healthy"] and row["restarts"] > restarts):
                assert time.monotonic() < deadline, f"the stub was not restarted: {row}"
                time.sleep(0.1)
            tensor = module_of(protocol).InferInput("DELAY_MS", [1], "INT32")
            tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
            assert connection.infer("slow", [tensor]).as_numpy("OUTPUT0")[0] == 1
    finally:
        connection.unregister_system_shared_memory()
        connection.close()
