"""Hostile gRPC requests against a real backend, on both stacks: a ModelInfer message of junk
fields is refused at the field budget (parsed off the event loop, health answered meanwhile), a
compressed message is held to the receive limit after inflating, and a malformed grpc-timeout is
refused as grpc.aio refuses it. PYSTUB_TEST_GRPC_SERVER narrows it to one stack."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import grpc
import ngh2
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from harness import GRPC_STACK, Backend, make_repository, module_backend

from pystub_backend.backend.frontends.grpc.protobuf_wire import MAX_FIELDS
from pystub_backend.backend.options import GRPC_STACKS

_DEADLINE = 60.0
_LIMIT = 8 << 20
_INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module", params=[GRPC_STACK] if GRPC_STACK else GRPC_STACKS)
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp(f"hostile_{request.param}"), "identity_fp32")
    with module_backend(Backend(repository, f"--grpc-server={request.param}",
                                f"--grpc-max-receive-message-length={_LIMIT}")) as server:
        yield server


@pytest.fixture
def channel(backend: Backend) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(backend.grpc_url, options=[("grpc.max_send_message_length", -1)]) as opened:
        yield opened


def _raw_infer(channel: grpc.Channel) -> grpc.UnaryUnaryMultiCallable:
    return channel.unary_unary(_INFER, request_serializer=lambda body: body, response_deserializer=lambda body: body)


def test_a_message_of_junk_fields_is_refused_and_health_answers_meanwhile(backend: Backend,
                                                                        channel: grpc.Channel) -> None:
    """4 MiB of an unknown field, two bytes each: 2 million fields, refused at the budget. While it
    is parsed (on a parsing thread), health checks on another connection are answered."""
    future = _raw_infer(channel).future(b"\x78\x00" * (2 << 20), timeout=_DEADLINE)
    with grpc.insecure_channel(backend.grpc_url) as other:
        health = health_pb2_grpc.HealthStub(other)
        answered = [health.Check(health_pb2.HealthCheckRequest(), timeout=_DEADLINE).status for _ in range(5)]
    with pytest.raises(grpc.RpcError) as info:
        future.result(timeout=_DEADLINE)
    assert answered == [health_pb2.HealthCheckResponse.SERVING] * 5
    assert info.value.code() == grpc.StatusCode.UNKNOWN
    assert f"more than {MAX_FIELDS} fields" in (info.value.details() or "")


def test_a_valid_large_request_still_passes(backend: Backend) -> None:
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        data = np.arange(1 << 20, dtype=np.float32).reshape(1, -1)  # 4 MiB: split off the loop
        tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        result = client.infer("identity_fp32", [tensor], client_timeout=_DEADLINE)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    finally:
        client.close()


def test_a_compressed_message_is_held_to_the_receive_limit(channel: grpc.Channel) -> None:
    """64 MiB of zeros, gzip-compressed by the client to some 64 KiB: refused at the 8 MiB limit."""
    with pytest.raises(grpc.RpcError) as info:
        _raw_infer(channel)(bytes(64 << 20), compression=grpc.Compression.Gzip, timeout=_DEADLINE)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize("value", ["-1S", "1.5S", "abc"])
def test_a_malformed_grpc_timeout_is_refused(backend: Backend, value: str) -> None:
    host, port = backend.grpc_url.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=_DEADLINE)
    try:
        client = ngh2.Connection(ngh2.Role.CLIENT)
        client.initiate_connection()
        stream = client.send_request([(b":method", b"POST"), (b":scheme", b"http"), (b":path", _INFER.encode()),
                                      (b":authority", b"x"), (b"content-type", b"application/grpc"),
                                      (b"te", b"trailers"), (b"grpc-timeout", value.encode())], end_stream=False)
        client.send_data(stream, bytes(5), end_stream=True)
        sock.sendall(client.data_to_send())
        status = None
        while status is None:
            data = sock.recv(1 << 16)
            assert data, "the server closed the connection without an answer"
            client.receive_data(data)
            for event in client.events():
                if isinstance(event, (ngh2.ResponseReceived, ngh2.TrailersReceived)):
                    fields = dict(event.headers)
                    if b"grpc-status" in fields:
                        status = (fields[b"grpc-status"], fields.get(b"grpc-message"))
            sock.sendall(client.data_to_send())
    finally:
        sock.close()
    assert status == (b"13", b"Error parsing 'grpc-timeout' metadata")
