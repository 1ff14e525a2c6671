"""The system shared memory extension through a real backend, with tritonclient's own helpers
(`tritonclient.utils.shared_memory`) over HTTP and gRPC.

The client creates and destroys its regions; the server maps them (never unlinks them), reads
inputs from them without copying them through its arena, has the stub write outputs straight into
them, and lets go of every mapping once a region is unregistered and its requests have ended.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from harness import LONG_LIVED_FDS, LONG_LIVED_PIDS, Backend, make_repository, module_backend
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size

MODELS = ("identity_fp32", "string_identity", "add_sub", "slow")
PROTOCOLS = ("http", "grpc")
TOO_SMALL = ("shared memory size specified with the request for output 'OUTPUT0' ({given} bytes) should "
             "be at least {needed} bytes to hold the results")


def _start_resource_tracker() -> None:
    """tritonclient's helpers use multiprocessing.shared_memory, whose resource tracker is a child
    process (and a pipe) that lives as long as this test process: not a leak of any one test."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    tracker = resource_tracker._resource_tracker  # noqa: SLF001 - no public way to learn its pid/fd
    if tracker._pid is not None:
        LONG_LIVED_PIDS.add(tracker._pid)
    if tracker._fd is not None:
        LONG_LIVED_FDS.add(tracker._fd)


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    _start_resource_tracker()
    repository = make_repository(tmp_path_factory.mktemp("client_shm"), *MODELS)
    with module_backend(Backend(repository, "--allow-client-shm=true")) as started:
        yield started


def client(backend: Backend, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(backend.http_url)
    return grpcclient.InferenceServerClient(backend.grpc_url)


@pytest.fixture(params=PROTOCOLS)
def protocol(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture()
def tc(backend: Backend, protocol: str) -> Iterator[Any]:
    """A tritonclient of the protocol under test; every region is unregistered afterwards."""
    connection = client(backend, protocol)
    try:
        yield connection
    finally:
        connection.unregister_system_shared_memory()
        connection.close()


def module_of(protocol: str) -> Any:
    return httpclient if protocol == "http" else grpcclient


_counter = iter(range(1_000_000))


@contextlib.contextmanager
def region(size: int) -> Iterator[tuple[Any, str]]:
    """A client region of `size` bytes, created and destroyed by the client; yields (handle, key).
    Destroying it fails if anyone else unlinked it."""
    key = f"/clientshm_{os.getpid()}_{next(_counter)}"
    handle = shm.create_shared_memory_region(key[1:], key, size, create_only=True)
    try:
        yield handle, key
    finally:
        shm.destroy_shared_memory_region(handle)
    assert not os.path.exists("/dev/shm" + key)


def error_of(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def is_invalid_argument(error: InferenceServerException, protocol: str) -> bool:
    return str(error.status()) == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")


def shm_input(protocol: str, name: str, shape: list[int], datatype: str, region_name: str, size: int,
              offset: int = 0) -> Any:
    tensor = module_of(protocol).InferInput(name, shape, datatype)
    tensor.set_shared_memory(region_name, size, offset)
    return tensor


def shm_output(protocol: str, name: str, region_name: str, size: int, offset: int = 0) -> Any:
    output = module_of(protocol).InferRequestedOutput(name)
    output.set_shared_memory(region_name, size, offset)
    return output


def mapped_by(pid: int, key: str) -> bool:
    """Whether process `pid` maps the shm object `key`."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return any(line.rstrip().endswith("/dev/shm" + key) or ("/dev/shm" + key + " ") in line
                       for line in maps)
    except FileNotFoundError:
        return False


def server_pids(backend: Backend) -> list[int]:
    return [backend.pid, *(p.pid for p in backend.stub_processes())]


def wait_unmapped(backend: Backend, *keys: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        holders = [(pid, key) for pid in server_pids(backend) for key in keys if mapped_by(pid, key)]
        if not holders:
            return
        assert time.monotonic() < deadline, f"still mapped after unregister: {holders}"
        time.sleep(0.05)


def stub_rows(backend: Backend, model: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/pystub/stubs", timeout=30) as response:
        return [row for row in json.loads(response.read())["stubs"] if row["model"] == model]


# -- register, status, unregister ----------------------------------------------------------------------
def test_register_status_unregister(tc: Any, protocol: str) -> None:
    with region(256) as (_, key_a), region(64) as (_, key_b):
        tc.register_system_shared_memory("a", key_a, 128, offset=100)
        tc.register_system_shared_memory("b", key_b, 64)
        status = tc.get_system_shared_memory_status()
        if protocol == "grpc":
            status = [{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
                      for r in status.regions.values()]
        assert sorted(status, key=lambda r: r["name"]) == [
            {"name": "a", "key": key_a, "offset": 100, "byte_size": 128},
            {"name": "b", "key": key_b, "offset": 0, "byte_size": 64}]
        one = tc.get_system_shared_memory_status("b")
        assert (one[0]["key"] if protocol == "http" else one.regions["b"].key) == key_b
        assert "b" in error_of(lambda: tc.register_system_shared_memory("b", key_a, 8)).message()
        tc.unregister_system_shared_memory("a")
        tc.unregister_system_shared_memory("never_registered")  # as in Triton: not an error
        names = [r["name"] for r in tc.get_system_shared_memory_status()] if protocol == "http" else \
            list(tc.get_system_shared_memory_status().regions)
        assert names == ["b"]
        assert "'a'" in error_of(lambda: tc.get_system_shared_memory_status("a")).message()
        tc.unregister_system_shared_memory()
        status = tc.get_system_shared_memory_status()
        assert (status == []) if protocol == "http" else (len(status.regions) == 0)


def test_registration_errors(tc: Any, protocol: str) -> None:
    with region(64) as (_, key):
        too_big = error_of(lambda: tc.register_system_shared_memory("r", key, 64, offset=1))
        assert "failed to register shared memory region 'r': invalid args" in too_big.message()
        missing = error_of(lambda: tc.register_system_shared_memory("r", key + "_missing", 8))
        assert f"Unable to open shared memory region: '{key}_missing'" in missing.message()
        own = error_of(lambda: tc.register_system_shared_memory("r", "/pystub_1_x_ctl", 8))
        assert "pystub's own" in own.message()
        for failure in (too_big, missing, own):
            assert is_invalid_argument(failure, protocol)
        status = tc.get_system_shared_memory_status()
        assert (status == []) if protocol == "http" else (len(status.regions) == 0)


def test_cuda_shared_memory_on_a_cpu_only_server(tc: Any, protocol: str) -> None:
    tc.unregister_cuda_shared_memory()  # what perf_analyzer calls even with --shared-memory system
    tc.unregister_cuda_shared_memory("any")
    status = tc.get_cuda_shared_memory_status()
    assert (status == []) if protocol == "http" else (len(status.regions) == 0)
    error = error_of(lambda: tc.register_cuda_shared_memory("c", "aGFuZGxl", 0, 64))  # base64 of a handle
    assert error.message() == "failed to register shared memory region: invalid args"  # Triton's, without a GPU


# -- inference ------------------------------------------------------------------------------------
def test_fp32_input_and_output_in_one_region(tc: Any, protocol: str) -> None:
    data = np.random.default_rng().random((2, 16), dtype=np.float32)
    with region(4096) as (handle, key):
        # one region, the input at an odd offset, the output after it; the region itself starts at 24
        shm.set_shared_memory_region(handle, [data], offset=24 + 12)
        tc.register_system_shared_memory("io", key, 4000, offset=24)
        result = tc.infer("identity_fp32", [shm_input(protocol, "INPUT0", [2, 16], "FP32", "io", 128, 12)],
                          outputs=[shm_output(protocol, "OUTPUT0", "io", 200, 1000)])
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [2, 16], 24 + 1000), data)
        output = result.get_output("OUTPUT0")
        shape = output["shape"] if protocol == "http" else list(output.shape)
        assert shape == [2, 16]


def test_bytes_input_and_output(tc: Any, protocol: str) -> None:
    data = np.array([b"pystub", b"", "shared ✓".encode(), b"\x00\xff" * 50], dtype=np.object_)
    serialized = serialize_byte_tensor(data)
    size = serialized_byte_size(serialized)
    with region(size) as (in_handle, in_key), region(1024) as (out_handle, out_key):
        shm.set_shared_memory_region(in_handle, [serialized])
        tc.register_system_shared_memory("in", in_key, size)
        tc.register_system_shared_memory("out", out_key, 1024)
        tc.infer("string_identity", [shm_input(protocol, "INPUT0", [4], "BYTES", "in", size)],
                 outputs=[shm_output(protocol, "OUTPUT0", "out", 1024)])
        np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.object_, [4]), data)


def test_mixing_shm_and_regular_tensors(tc: Any, protocol: str) -> None:
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    b = np.array([10, 20, 30, 40], dtype=np.float32)
    module = module_of(protocol)
    with region(16) as (in_handle, in_key), region(16) as (out_handle, out_key):
        shm.set_shared_memory_region(in_handle, [a])
        tc.register_system_shared_memory("in", in_key, 16)
        tc.register_system_shared_memory("out", out_key, 16)
        regular = module.InferInput("INPUT1", [4], "FP32")
        regular.set_data_from_numpy(b)
        result = tc.infer("add_sub", [shm_input(protocol, "INPUT0", [4], "FP32", "in", 16), regular],
                          outputs=[shm_output(protocol, "OUTPUT0", "out", 16), module.InferRequestedOutput("OUTPUT1")])
        np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [4]), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        response = result.get_response()
        # docs/reference/protocol.md#compatibility-with-perf_analyzer: the shm output is {name, datatype, shape}
        # only
        if protocol == "http":
            assert response["outputs"][0] == {"name": "OUTPUT0", "datatype": "FP32", "shape": [4]}
        else:  # 16.2: one raw_output_contents entry per output, empty for the shm one
            assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
            assert response.raw_output_contents[0] == b"" and len(response.raw_output_contents[1]) == 16


def test_inputs_do_not_pass_through_the_backend(backend: Backend, tc: Any, protocol: str) -> None:
    """A 4 MiB input larger than the 1 MiB arena reaches the stub without growing the backend's
    arena: the stub maps the client's region (read-only) and writes the output into the other."""
    data = np.arange(1 << 20, dtype=np.float32).reshape(1, -1)
    with region(data.nbytes) as (in_handle, in_key), region(data.nbytes) as (out_handle, out_key):
        shm.set_shared_memory_region(in_handle, [data])
        tc.register_system_shared_memory("in", in_key, data.nbytes)
        tc.register_system_shared_memory("out", out_key, data.nbytes)
        tc.infer("identity_fp32", [shm_input(protocol, "INPUT0", list(data.shape), "FP32", "in", data.nbytes)],
                 outputs=[shm_output(protocol, "OUTPUT0", "out", data.nbytes)])
        np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, list(data.shape)), data)
        (row,) = stub_rows(backend, "identity_fp32")
        assert row["arena_total_bytes"] < data.nbytes, row
        assert mapped_by(row["pid"], in_key) and mapped_by(row["pid"], out_key)
        tc.unregister_system_shared_memory()
        wait_unmapped(backend, in_key, out_key)  # the backend and the stub let go of both


def test_stream_infer_with_shm(backend: Backend) -> None:
    data = np.arange(8, dtype=np.float32).reshape(1, 8)
    results: queue.Queue[Any] = queue.Queue()
    connection = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        with region(32) as (in_handle, in_key), region(32) as (out_handle, out_key):
            shm.set_shared_memory_region(in_handle, [data])
            connection.register_system_shared_memory("in", in_key, 32)
            connection.register_system_shared_memory("out", out_key, 32)
            connection.start_stream(callback=lambda result, error: results.put((result, error)))
            for index in range(3):
                connection.async_stream_infer(
                    "identity_fp32", [shm_input("grpc", "INPUT0", [1, 8], "FP32", "in", 32)],
                    outputs=[shm_output("grpc", "OUTPUT0", "out", 32)], request_id=str(index))
            for _ in range(3):
                result, error = results.get(timeout=30)
                assert error is None and result.get_response().raw_output_contents == [b""]
            connection.stop_stream()
            np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [1, 8]), data)
            connection.unregister_system_shared_memory()
            wait_unmapped(backend, in_key, out_key)
    finally:
        connection.close()


def test_concurrent_requests_on_separate_regions(backend: Backend) -> None:
    def worker(index: int) -> None:
        connection = grpcclient.InferenceServerClient(backend.grpc_url)
        try:
            with region(512) as (handle, key):
                connection.register_system_shared_memory(f"w{index}", key, 512)
                for round_ in range(15):
                    data = np.full((1, 64), index * 100 + round_, dtype=np.float32)
                    shm.set_shared_memory_region(handle, [data])
                    connection.infer("identity_fp32", [shm_input("grpc", "INPUT0", [1, 64], "FP32", f"w{index}", 256)],
                                     outputs=[shm_output("grpc", "OUTPUT0", f"w{index}", 256, 256)])
                    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [1, 64], 256), data)
                connection.unregister_system_shared_memory(f"w{index}")
        finally:
            connection.close()

    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            worker(index)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors


# -- errors ----------------------------------------------------------------------------------------
def test_request_errors_are_invalid_argument(backend: Backend, tc: Any, protocol: str) -> None:
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    with region(128) as (handle, key):
        shm.set_shared_memory_region(handle, [data])
        tc.register_system_shared_memory("r", key, 128)

        def infer(inputs: list[Any], outputs: list[Any] | None = None) -> InferenceServerException:
            error = error_of(lambda: tc.infer("identity_fp32", inputs, outputs=outputs))
            assert is_invalid_argument(error, protocol), (error.status(), error.message())
            return error

        assert "Unable to find shared memory region: 'nope'" in infer(
            [shm_input(protocol, "INPUT0", [1, 16], "FP32", "nope", 64)]).message()
        assert "Invalid offset + byte size for shared memory region: 'r'" in infer(
            [shm_input(protocol, "INPUT0", [1, 16], "FP32", "r", 64, 100)]).message()
        assert "Unable to find shared memory region: 'gone'" in infer(
            [shm_input(protocol, "INPUT0", [1, 16], "FP32", "r", 64)],
            [shm_output(protocol, "OUTPUT0", "gone", 64)]).message()
        assert "Invalid offset + byte size for shared memory region: 'r'" in infer(
            [shm_input(protocol, "INPUT0", [1, 16], "FP32", "r", 64)],
            [shm_output(protocol, "OUTPUT0", "r", 64, 65)]).message()
        # the shm byte size is what validation checks against the shape
        assert "Expected 64, got 60" in infer([shm_input(protocol, "INPUT0", [1, 16], "FP32", "r", 60)]).message()
        # an output larger than its region: Triton's text, and nothing is written
        before = bytes(shm.get_contents_as_numpy(handle, np.uint8, [128]))
        message = infer([shm_input(protocol, "INPUT0", [1, 16], "FP32", "r", 64)],
                        [shm_output(protocol, "OUTPUT0", "r", 40, 64)]).message()
        assert TOO_SMALL.format(given=40, needed=64) in message
        assert bytes(shm.get_contents_as_numpy(handle, np.uint8, [128])) == before
        # the server goes on serving
        result = tc.infer("identity_fp32", [shm_input(protocol, "INPUT0", [1, 16], "FP32", "r", 64)])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def test_negative_or_missing_sizes_over_http(backend: Backend) -> None:
    with region(64) as (_, key):
        connection = httpclient.InferenceServerClient(backend.http_url)
        try:
            connection.register_system_shared_memory("r", key, 64)
            for parameters, text in (({"shared_memory_region": "r"}, "has no 'shared_memory_byte_size'"),
                                     ({"shared_memory_region": "r", "shared_memory_byte_size": -4},
                                      "non-negative integers"),
                                     ({"shared_memory_region": "r", "shared_memory_byte_size": 4,
                                       "shared_memory_offset": -1}, "non-negative integers"),
                                     ({"shared_memory_region": 7, "shared_memory_byte_size": 4}, "must be a string")):
                body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1],
                                               "parameters": parameters}]}).encode()
                request = urllib.request.Request(f"http://{backend.http_url}/v2/models/identity_fp32/infer",
                                                 data=body, method="POST")
                with pytest.raises(urllib.error.HTTPError) as info:
                    urllib.request.urlopen(request, timeout=30)
                assert info.value.code == 400
                assert text in json.loads(info.value.read())["error"]
        finally:
            connection.unregister_system_shared_memory()
            connection.close()


def test_unregister_while_a_request_is_in_flight(backend: Backend, protocol: str) -> None:
    delay = np.array([2000], dtype=np.int32)
    connection = client(backend, protocol)
    try:
        with region(8) as (handle, key):
            shm.set_shared_memory_region(handle, [delay])
            connection.register_system_shared_memory("in", key, 4)
            connection.register_system_shared_memory("out", key, 4, offset=4)
            outcome: queue.Queue[Any] = queue.Queue()

            def call() -> None:
                worker = client(backend, protocol)
                try:
                    worker.infer("slow", [shm_input(protocol, "DELAY_MS", [1], "INT32", "in", 4)],
                                 outputs=[shm_output(protocol, "OUTPUT0", "out", 4)])
                    outcome.put(None)
                except BaseException as exc:  # noqa: BLE001 - reported by the test thread
                    outcome.put(exc)
                finally:
                    worker.close()

            thread = threading.Thread(target=call)
            thread.start()
            deadline = time.monotonic() + 10
            while not any(row["in_flight"] for row in stub_rows(backend, "slow")):
                assert time.monotonic() < deadline, "the request never reached the stub"
                time.sleep(0.02)
            connection.unregister_system_shared_memory()
            assert thread.is_alive()  # unregister did not wait for the request
            status = connection.get_system_shared_memory_status()
            assert (status == []) if protocol == "http" else (len(status.regions) == 0)
            thread.join(30)
            assert outcome.get_nowait() is None
            # the stub wrote the output into the region although it was unregistered meanwhile
            assert shm.get_contents_as_numpy(handle, np.int32, [1], 4)[0] == delay[0]
            wait_unmapped(backend, key)
    finally:
        connection.close()


# -- own backends ----------------------------------------------------------------------------------
def test_disabled_by_default(tmp_path: Any) -> None:
    _start_resource_tracker()
    repository = make_repository(tmp_path, "identity_fp32")
    with Backend(repository) as backend, region(64) as (_, key):
        for protocol in PROTOCOLS:
            connection = client(backend, protocol)
            try:
                metadata = connection.get_server_metadata()
                extensions = metadata["extensions"] if protocol == "http" else list(metadata.extensions)
                assert "system_shared_memory" not in extensions and "binary_tensor_data" in extensions
                assert "cuda_shared_memory" not in extensions
                for call in (lambda c=connection: c.register_system_shared_memory("r", key, 64),
                             lambda c=connection: c.get_system_shared_memory_status(),
                             lambda c=connection: c.unregister_system_shared_memory()):
                    assert "--allow-client-shm=true" in error_of(call).message()
                connection.unregister_cuda_shared_memory()  # still fine: nothing to unregister
                error = error_of(lambda c=connection, p=protocol: c.infer(
                    "identity_fp32", [shm_input(p, "INPUT0", [1, 16], "FP32", "r", 64)]))
                assert "Unable to find shared memory region: 'r'" in error.message()
                assert "--allow-client-shm=true" in error.message()
            finally:
                connection.close()


def test_the_server_never_unlinks_a_client_region(tmp_path: Any) -> None:
    """Registered, used and never unregistered when the server stops: the object is still the
    client's afterwards (region() fails if it is gone)."""
    _start_resource_tracker()
    repository = make_repository(tmp_path, "identity_fp32")
    data = np.ones((1, 4), dtype=np.float32)
    with region(32) as (handle, key):
        shm.set_shared_memory_region(handle, [data])
        with Backend(repository, "--allow-client-shm", "true") as backend:
            connection = grpcclient.InferenceServerClient(backend.grpc_url)
            try:
                connection.register_system_shared_memory("r", key, 32)
                connection.infer("identity_fp32", [shm_input("grpc", "INPUT0", [1, 4], "FP32", "r", 16)],
                                 outputs=[shm_output("grpc", "OUTPUT0", "r", 16, 16)])
            finally:
                connection.close()
        assert os.path.exists("/dev/shm" + key)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [1, 4], 16), data)
