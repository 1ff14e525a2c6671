"""Both gRPC serving stacks (`--grpc-server=h2`, the default, and `--grpc-server=aio`) behind a real
backend: the suite runs over the default, so this file keeps the other one serving what clients
use most (unary inference small and large, a decoupled stream, health, reflection, an unknown
model's error and a deadline) with the same answers. PYSTUB_TEST_GRPC_SERVER narrows it to one."""

from __future__ import annotations

import queue
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from harness import GRPC_STACK, Backend, make_repository, module_backend
from tritonclient.utils import InferenceServerException

from pystub_backend.backend.options import GRPC_STACKS

_DEADLINE = 30.0  # seconds any one call may take


@pytest.fixture(scope="module", params=[GRPC_STACK] if GRPC_STACK else GRPC_STACKS)
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp(f"stack_{request.param}"), "identity_fp32", "repeat",
                                 "slow")
    with module_backend(Backend(repository, f"--grpc-server={request.param}")) as server:
        yield server


@pytest.fixture
def client(backend: Backend) -> Iterator[grpcclient.InferenceServerClient]:
    opened = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        yield opened
    finally:
        opened.close()


def _tensor(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


@pytest.mark.parametrize("count", [4, 1 << 18])  # 16 B and 1 MiB
def test_unary_inference(client: grpcclient.InferenceServerClient, count: int) -> None:
    data = np.arange(count, dtype=np.float32).reshape(1, -1)
    result = client.infer("identity_fp32", [_tensor("INPUT0", data, "FP32")], client_timeout=_DEADLINE)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def test_decoupled_stream(client: grpcclient.InferenceServerClient) -> None:
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        inputs = [_tensor("COUNT", np.array([3], np.int32), "INT32"),
                  _tensor("DELAY_MS", np.array([0], np.int32), "INT32")]
        client.async_stream_infer("repeat", inputs, enable_empty_final_response=True)
        items = [results.get(timeout=_DEADLINE) for _ in range(4)]
    finally:
        client.stop_stream()
    assert [error for _, error in items] == [None] * 4
    assert [int(result.as_numpy("OUT")[0]) for result, _ in items[:3]] == [0, 1, 2]
    assert items[3][0].get_response().parameters["triton_final_response"].bool_param


def test_health_and_reflection(backend: Backend) -> None:
    with grpc.insecure_channel(backend.grpc_url) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=_DEADLINE)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        answers = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                  timeout=_DEADLINE)
        services = {service.name for answer in answers for service in answer.list_services_response.service}
    assert {"inference.GRPCInferenceService", "grpc.health.v1.Health"} <= services


def test_unknown_model_is_triton_error(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as error:
        client.infer("nope", [_tensor("INPUT0", np.zeros((1, 4), np.float32), "FP32")], client_timeout=_DEADLINE)
    assert error.value.status() == "StatusCode.NOT_FOUND"
    assert error.value.message() == "Request for unknown model: 'nope' is not found"


def test_deadline_ends_the_call(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as error:
        client.infer("slow", [_tensor("DELAY_MS", np.array([5000], np.int32), "INT32")], client_timeout=0.5)
    assert error.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    # the server is still serving after the call it gave up on
    assert client.is_model_ready("slow")
