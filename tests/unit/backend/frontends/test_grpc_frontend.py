"""The gRPC servicer driven by the real `tritonclient.grpc` client against an in-test core.

The server runs on its own event loop in a background thread, because tritonclient's client is
blocking; the fixture stops the server, the loop and the thread after every test. Every test runs
over both gRPC stacks (h2 and grpc.aio), or over the one PYSTUB_TEST_GRPC_SERVER names.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import text_format
from harness import GRPC_STACK
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.frontends.grpc.listener import create_grpc_server
from pystub_backend.backend.inference import InferRequest, InferResponse, Tensor
from pystub_backend.backend.options import GRPC_STACKS, GrpcOptions

MODEL = "identity"
BROKEN = "broken"  # answers with an output buffer the encoder cannot read
CONFIG_TEXT = """
name: "identity"
backend: "python"
max_batch_size: 0
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
"""
DURATION = {"count": 3, "ns": 1500}
STATS = {
    "name": MODEL, "version": "1", "last_inference": 1700000000000,
    "inference_count": 8, "execution_count": 2,
    "inference_stats": {k: DURATION for k in ("success", "fail", "queue", "compute_input",
                                              "compute_infer", "compute_output", "cache_hit",
                                              "cache_miss")},
    "response_stats": {"0": {k: DURATION for k in ("compute_infer", "compute_output", "success",
                                                   "fail", "empty_response", "cancel")}},
    "batch_stats": [{"batch_size": 4, "compute_input": DURATION, "compute_infer": DURATION,
                     "compute_output": DURATION}],
    "memory_usage": [],
}


def _unknown(name: str) -> ServerError:
    return ServerError(f"Request for unknown model: '{name}' is not found", Status.NOT_FOUND)


class EchoCore:
    """One model, `identity`: every input `INPUTi` comes back as `OUTPUTi`, data unchanged."""

    server_name = "pystub-test"
    server_version = "0.0.1"
    extensions = ["statistics", "model_repository"]

    def __init__(self) -> None:
        self.released = 0

    def _check(self, name: str) -> None:
        if name not in (MODEL, BROKEN):
            raise _unknown(name)

    def is_live(self) -> bool:
        return True

    def is_decoupled(self, name: str, version: str = "") -> bool:
        return False

    def target(self, name: str, version: str = "") -> Any:
        return None  # no model is decoupled: the frontend asks the core to look it up

    def is_ready(self) -> bool:
        return True

    async def model_ready(self, name: str, version: str = "") -> bool:
        return name == MODEL

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        self._check(name)
        tensor = {"datatype": "FP32", "shape": [-1]}
        return {"name": MODEL, "versions": ["1"], "platform": "python",
                "inputs": [{"name": "INPUT0", **tensor}], "outputs": [{"name": "OUTPUT0", **tensor}]}

    def model_config(self, name: str, version: str = "") -> Any:
        self._check(name)
        return text_format.Parse(CONFIG_TEXT, model_config_pb2.ModelConfig())

    def model_config_json(self, name: str, version: str = "") -> dict[str, Any]:
        raise NotImplementedError

    async def infer(self, request: InferRequest, target: Any = None) -> InferResponse:
        self._check(request.model_name)
        outputs = [Tensor(t.name.replace("INPUT", "OUTPUT"), t.datatype, t.shape,
                          memoryview(bytearray(t.data)))  # a fresh buffer, as an arena would be
                   for t in request.inputs]
        if request.model_name == BROKEN:
            outputs = [Tensor("OUTPUT0", "BYTES", (1,), np.array([b"x"], dtype=np.object_))]
        return InferResponse(MODEL, "1", request.id, outputs, release=self._release)

    def _release(self) -> None:
        self.released += 1

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        return [{"name": MODEL, "version": "1", "state": "READY", "reason": ""}]

    def statistics(self, name: str = "", version: str = "") -> list[dict[str, Any]]:
        if name:
            self._check(name)
        return [STATS]


class _ServerThread:
    """pystub's gRPC server on a private event loop in a daemon thread."""

    def __init__(self, core: EchoCore, stack: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="grpc-test-server")
        self.thread.start()
        self.server, self.port = self._run(self._start(core, stack))

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    @staticmethod
    async def _start(core: EchoCore, stack: str) -> tuple[Any, int]:
        server, port = create_grpc_server(core, "127.0.0.1", 0, GrpcOptions(stack=stack))
        await server.start()
        return server, port

    def close(self) -> None:
        try:
            self._run(self.server.stop(None))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self.loop.close()
            # grpc.aio stops its poller thread when the last aio object is freed, not on stop()
            self.server = None
            gc.collect()


@pytest.fixture
def core() -> EchoCore:
    return EchoCore()


@pytest.fixture(params=[GRPC_STACK] if GRPC_STACK else GRPC_STACKS)
def server(core: EchoCore, request: pytest.FixtureRequest) -> Iterator[_ServerThread]:
    running = _ServerThread(core, request.param)
    try:
        yield running
    finally:
        running.close()
    assert not running.thread.is_alive()


@pytest.fixture
def client(server: _ServerThread) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    try:
        yield triton
    finally:
        triton.close()


def _identity(client: grpcclient.InferenceServerClient, array: np.ndarray, datatype: str) -> np.ndarray:
    inp = grpcclient.InferInput("INPUT0", list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    result = client.infer(MODEL, [inp], request_id="req-1")
    assert result.get_response().id == "req-1"
    out = result.as_numpy("OUTPUT0")
    assert out is not None
    return out


def test_health(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready(MODEL)
    assert not client.is_model_ready("nope")


def test_server_metadata(client: grpcclient.InferenceServerClient) -> None:
    meta = client.get_server_metadata(as_json=True)
    assert meta == {"name": "pystub-test", "version": "0.0.1",
                    "extensions": ["statistics", "model_repository"]}


def test_model_metadata(client: grpcclient.InferenceServerClient) -> None:
    meta = client.get_model_metadata(MODEL)
    assert (meta.name, list(meta.versions), meta.platform) == (MODEL, ["1"], "python")
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("INPUT0", "FP32", [-1])]
    assert [t.name for t in meta.outputs] == ["OUTPUT0"]


def test_model_config(client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config(MODEL).config
    assert config.name == MODEL and config.backend == "python"
    assert list(config.input[0].dims) == [-1]


@pytest.mark.parametrize(("datatype", "array"), [
    ("FP32", np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)),
    ("INT8", np.array([[-128, 0, 127]], dtype=np.int8)),
    ("BOOL", np.array([True, False, True])),
    ("BYTES", np.array([b"hello", b"", "wörld".encode()], dtype=np.object_)),
])
def test_identity(client: grpcclient.InferenceServerClient, core: EchoCore,
                  datatype: str, array: np.ndarray) -> None:
    out = _identity(client, array, datatype)
    assert out.shape == array.shape
    np.testing.assert_array_equal(out, array)
    assert core.released == 1


def test_16_mib_tensor_has_no_size_limit(client: grpcclient.InferenceServerClient) -> None:
    array = np.arange(4 * 1024 * 1024, dtype=np.float32)  # 16 MiB, over grpc's 4 MiB default
    np.testing.assert_array_equal(_identity(client, array, "FP32"), array)


def test_unknown_model_is_not_found(client: grpcclient.InferenceServerClient) -> None:
    inp = grpcclient.InferInput("INPUT0", [1], "FP32")
    inp.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    for call in (lambda: client.infer("nope", [inp]), lambda: client.get_model_metadata("nope")):
        with pytest.raises(InferenceServerException) as info:
            call()
        assert info.value.status() == "StatusCode.NOT_FOUND"
        assert info.value.message() == "Request for unknown model: 'nope' is not found"


def test_codec_error_is_invalid_argument(server: _ServerThread) -> None:
    # tritonclient never mixes raw and typed contents, so speak to the service directly
    request = service_pb2.ModelInferRequest(model_name=MODEL, raw_input_contents=[bytes(4)])
    request.inputs.add(name="A", datatype="FP32", shape=[1])
    request.inputs.add(name="B", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == ("contents field must not be specified when using "
                                    "raw_input_contents for 'B' for model 'identity'")


def test_unexpected_error_is_internal_and_output_still_released(
        client: grpcclient.InferenceServerClient, core: EchoCore,
        caplog: pytest.LogCaptureFixture) -> None:
    inp = grpcclient.InferInput("INPUT0", [1], "FP32")
    inp.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer(BROKEN, [inp])
    assert info.value.status() == "StatusCode.INTERNAL"
    assert "object" in info.value.message()  # the encoder's own complaint about the buffer
    assert core.released == 1
    (record,) = [r for r in caplog.records if r.name == "pystub_backend.backend.frontends.grpc.servicer"]
    assert record.getMessage() == "gRPC ModelInfer failed" and record.exc_info
    # the logged traceback holds the server's call objects alive, and with them grpc's poller
    record.exc_info = None


def test_unimplemented_rpcs(client: grpcclient.InferenceServerClient, server: _ServerThread,
                            caplog: pytest.LogCaptureFixture) -> None:
    # TraceSetting, the last RPC pystub lacked, is answered now (tests/integration/test_tracing.py);
    # a method the service does not have is still UNIMPLEMENTED, without a servicer crash.
    assert client.get_trace_settings(as_json=True)["settings"]["trace_mode"]["value"] == ["triton"]
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/NoSuchMethod",
                                   request_serializer=lambda body: body, response_deserializer=lambda body: body)
        with pytest.raises(grpc.RpcError) as info:
            call(b"", timeout=30)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # no servicer crash logged


def test_inference_statistics(client: grpcclient.InferenceServerClient) -> None:
    stats = client.get_inference_statistics(MODEL, as_json=True)
    (model,) = stats["model_stats"]
    # proto3 JSON renders uint64 as strings; compare against the core's dict the same way
    assert model["inference_stats"]["queue"] == {"count": "3", "ns": "1500"}
    assert model["response_stats"]["0"]["empty_response"] == {"count": "3", "ns": "1500"}
    assert model["batch_stats"][0]["batch_size"] == "4"
    assert (model["name"], model["version"], model["inference_count"],
            model["execution_count"], model["last_inference"]) == (
        MODEL, "1", "8", "2", "1700000000000")


def test_repository_index(client: grpcclient.InferenceServerClient) -> None:
    index = client.get_model_repository_index(as_json=True)
    assert index == {"models": [{"name": MODEL, "version": "1", "state": "READY"}]}


def test_busy_port_is_an_error(server: _ServerThread, core: EchoCore) -> None:
    async def bind_again() -> None:
        create_grpc_server(core, "127.0.0.1", server.port)

    # without SO_REUSEPORT off, the second bind would succeed and steal connections
    with pytest.raises(OSError, match=str(server.port)):
        server._run(bind_again())
