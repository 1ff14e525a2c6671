"""A client that leaves cancels every request it had in flight: the model sees is_cancelled() soon
after, whether the client closed, reset (SO_LINGER 0) or was killed (SIGKILL), for gRPC streams
(five requests on one stream), HTTP server-sent events and unary calls, with and without frontend
workers. The `flood` model streams until it sees is_cancelled() and notes that in a file."""

from __future__ import annotations

import signal
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Backend, make_repository, module_backend
from stream_clients import GrpcStream, SseStream, client_process, flood_request, notes, wait_until

# The model must see the cancellation within 1 s; a loaded 2-core machine (load average 8) gets slack.
CANCEL_DEADLINE = 5.0
START_DEADLINE = 60.0  # every request reached the model


@pytest.fixture(scope="module", params=[0, 2], ids=["in-process", "workers"])
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("leaving"), "flood", "unary_cancel")
    workers = [f"--frontend-workers={request.param}"] if request.param else []
    with module_backend(Backend(repository, *workers)) as server:
        yield server


def _wait_started(record_dir: Path, prefix: str, count: int) -> None:
    wait_until(lambda: len(notes(record_dir, "started", prefix)) == count, START_DEADLINE,
               f"{count} requests '{prefix}*' in the model")


def _assert_cancelled_soon(record_dir: Path, prefix: str, count: int) -> None:
    took = wait_until(lambda: len(notes(record_dir, "cancelled", prefix)) == count, CANCEL_DEADLINE,
                      f"the model to see all {count} requests '{prefix}*' cancelled "
                      f"(cancelled: {sorted(notes(record_dir, 'cancelled', prefix))})")
    print(f"{prefix}: all {count} cancelled {took:.2f} s after the client left")


@pytest.mark.parametrize("pause_ms", [0, 200], ids=["flooding", "quiet"])
def test_a_grpc_stream_that_is_cancelled_and_closed_cancels_its_five_requests(
        backend: Backend, tmp_path: Path, pause_ms: float):
    prefix = f"grpc-close-{pause_ms}"
    stream = GrpcStream(backend.grpc_url, [flood_request(f"{prefix}-{k}", tmp_path, pause_ms=pause_ms)
                                           for k in range(5)])
    try:
        _wait_started(tmp_path, prefix, 5)
    finally:
        stream.leave()
    _assert_cancelled_soon(tmp_path, prefix, 5)


@pytest.mark.parametrize("kind", ["grpc", "sse"])
def test_a_killed_client_cancels_its_requests(backend: Backend, tmp_path: Path, kind: str):
    prefix = f"{kind}-killed"
    url = backend.grpc_url if kind == "grpc" else backend.http_url
    client = client_process(kind, url, tmp_path, prefix, 5)
    try:
        _wait_started(tmp_path, prefix, 5)
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait(30)
        assert client.stdout is not None
        client.stdout.close()
    _assert_cancelled_soon(tmp_path, prefix, 5)


@pytest.mark.parametrize("how", ["close", "reset"])
@pytest.mark.parametrize("pause_ms", [0, 200], ids=["flooding", "quiet"])
def test_an_sse_client_that_closes_or_resets_cancels_its_request(backend: Backend, tmp_path: Path, how: str,
                                                                 pause_ms: float):
    prefix = f"sse-{how}-{pause_ms}"
    streams = [SseStream(backend.http_url, f"{prefix}-{k}", tmp_path, pause_ms=pause_ms) for k in range(3)]
    try:
        _wait_started(tmp_path, prefix, 3)
    finally:
        for stream in streams:
            stream.leave(how)
    _assert_cancelled_soon(tmp_path, prefix, 3)


@pytest.mark.parametrize("how", ["close", "reset"])
def test_an_http_client_that_leaves_a_unary_call_cancels_it(backend: Backend, how: str):
    seen, waiting = backend.log().count("unary_cancel: cancelled at"), backend.log().count("unary_cancel: waiting")
    body = b'{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1],"data":[7]}]}'
    host, port = backend.http_url.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(b"POST /v2/models/unary_cancel/infer HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    backend.wait_for_log("unary_cancel: waiting", timeout=START_DEADLINE, count=waiting + 1)
    if how == "reset":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    wait_until(lambda: backend.log().count("unary_cancel: cancelled at") > seen, CANCEL_DEADLINE,
               "the unary model to see is_cancelled()")
