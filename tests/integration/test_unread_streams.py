"""Clients that never read their streams hold a bounded amount of the server's memory each, and
give it back when they leave (docs/hostile-input.md, "Streams whose client does not read").

Forty gRPC streams (twenty SSE connections: their JSON costs CPU) ask the `flood` model for 64 KiB
(16 KiB) responses without end and never read. Once every request's send window in the stub is
full, the RSS growth of the backend, the stubs and the workers stays within a few MiB per stream
(before the windows counted bytes and the gRPC writer's queue was bounded in bytes, each stream
held 64 responses in the stub and 64 more in the frontend: about 8 MiB). When the clients leave,
every request is cancelled, the arenas are empty again and nothing stays in flight; a second wave
costs next to nothing more.

One client is bounded too, however many requests it sends: 200 requests on one unread stream run
16 (`STREAM_MAX_REQUESTS`) at a time, the rest stay unread in the stream (before, each of the 200
filled a send window of its own: 50 MiB), and a client that reads gets all 200 answered."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from harness import Backend, make_repository
from stream_clients import GrpcStream, Memory, SseStream, flood_request, notes, wait_until
from tritonclient.grpc import service_pb2

from pystub_backend.backend.frontends.grpc.stream import STREAM_MAX_REQUESTS

SHAPES = {"grpc": (40, 64 << 10), "sse": (20, 16 << 10)}  # streams, bytes per response
WINDOW_BYTES = 256 << 10  # pystub_backend.stub.senders.WINDOW_BYTES
PER_STREAM_MIB = {"backend": 2.0, "stubs": 1.0, "workers": 2.0}  # generous: the documented bound is below
SECOND_WAVE_MIB = 24.0  # allocator noise; a leak of the first wave's windows would be ~40 MiB
ONE_CLIENT_REQUESTS, ONE_CLIENT_SIZE = 200, 16 << 10
# The stub's arena: a full window plus one response of each running request of the stream.
ONE_CLIENT_ARENA = STREAM_MAX_REQUESTS * (WINDOW_BYTES + 2 * ONE_CLIENT_SIZE)
ONE_CLIENT_MIB = 20.0  # per process, generous (the arena counts in the stub's and the backend's RSS)


@pytest.fixture(params=[0, 2], ids=["in-process", "workers"])
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    """A fresh backend per test: its RSS before the first wave is the baseline."""
    repository = make_repository(tmp_path_factory.mktemp("unread"), "flood")
    workers = [f"--frontend-workers={request.param}"] if request.param else []
    with Backend(repository, *workers) as server:
        yield server


def _flood_stub(backend: Backend) -> dict:
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/pystub/stubs", timeout=30) as response:
        return next(row for row in json.loads(response.read())["stubs"] if row["model"] == "flood")


def _open(kind: str, backend: Backend, prefix: str, record_dir: Path) -> list[GrpcStream | SseStream]:
    streams, size = SHAPES[kind]
    if kind == "grpc":
        return [GrpcStream(backend.grpc_url, [flood_request(f"{prefix}-{k}", record_dir, size)])
                for k in range(streams)]
    return [SseStream(backend.http_url, f"{prefix}-{k}", record_dir, size) for k in range(streams)]


def _settled_peak(backend: Backend) -> Memory:
    """The RSS once it stopped growing: two samples 0.5 s apart within 1 MiB of each other."""
    peak = Memory.of(backend.pid)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(0.5)
        sample = Memory.of(backend.pid)
        grew = sample.growth(peak)
        peak = peak.peak(sample)
        if max(grew.backend, grew.stubs, grew.workers) < 1.0:
            break
    return peak


def _wave(kind: str, backend: Backend, prefix: str, record_dir: Path) -> Memory:
    """Open the unread streams, wait until their windows are full; the settled RSS; then leave and
    check that everything was cancelled and given back."""
    streams = SHAPES[kind][0]
    clients = _open(kind, backend, prefix, record_dir)
    try:
        wait_until(lambda: len(notes(record_dir, "started", prefix)) == streams, 60, f"{streams} requests started")
        wait_until(lambda: _flood_stub(backend)["s2p_used_bytes"] >= streams * WINDOW_BYTES, 60,
                   "every request's send window to fill")
        peak = _settled_peak(backend)
    finally:
        for client in clients:
            client.leave()
    # Cancelled, or refused already: a window that stays full past the stub's send timeout fails its request.
    wait_until(lambda: len(notes(record_dir, "cancelled", prefix) | notes(record_dir, "refused", prefix)) == streams,
               20, "every request cancelled (or refused)")
    wait_until(lambda: _flood_stub(backend)["in_flight"] == 0, 20, "no request in flight")
    wait_until(lambda: _flood_stub(backend)["s2p_used_bytes"] == 0 and _flood_stub(backend)["arena_used_bytes"] == 0,
               20, "both arenas of the stub empty")
    return peak


@pytest.mark.parametrize("kind", ["grpc", "sse"])
def test_unread_streams_hold_a_bounded_window_each_and_give_it_back(backend: Backend, tmp_path: Path, kind: str):
    before = Memory.of(backend.pid)
    first = _wave(kind, backend, f"{kind}-first", tmp_path)
    second = _wave(kind, backend, f"{kind}-second", tmp_path)
    grown, streams = first.growth(before), SHAPES[kind][0]
    print(f"{streams} unread {kind} streams: before {before}\nfirst peak {first}\nsecond peak {second}")
    for process, per_stream in PER_STREAM_MIB.items():
        assert getattr(grown, process) <= streams * per_stream, f"{process} grew by {getattr(grown, process):.0f} MiB"
    again = second.growth(first)
    for process in PER_STREAM_MIB:
        took = getattr(again, process)
        assert took <= SECOND_WAVE_MIB, f"{process}: a second wave took {took:.0f} MiB more"


def test_an_unread_stream_of_many_requests_runs_a_bounded_number(backend: Backend, tmp_path: Path):
    before = Memory.of(backend.pid)
    requests = [flood_request(f"r{k}", tmp_path, ONE_CLIENT_SIZE) for k in range(ONE_CLIENT_REQUESTS)]
    client = GrpcStream(backend.grpc_url, requests)
    try:
        wait_until(lambda: _flood_stub(backend)["s2p_used_bytes"] >= STREAM_MAX_REQUESTS * WINDOW_BYTES, 60,
                   f"the send windows of {STREAM_MAX_REQUESTS} requests to fill")
        peak = Memory.of(backend.pid)
        held = _flood_stub(backend)["s2p_used_bytes"]
        started = notes(tmp_path, "started")
    finally:
        client.leave()
    grown = peak.growth(before)
    print(f"one unread stream of {ONE_CLIENT_REQUESTS} requests: {len(started)} started, "
          f"arena {held >> 10} KiB, grew {grown}")
    assert len(started) == STREAM_MAX_REQUESTS, f"{len(started)} requests of one unread stream started"
    assert held <= ONE_CLIENT_ARENA, f"the stream holds {held} bytes of the stub's arena"
    for process in ("backend", "stubs", "workers"):
        assert getattr(grown, process) <= ONE_CLIENT_MIB, f"{process} grew by {getattr(grown, process):.0f} MiB"
    wait_until(lambda: len(notes(tmp_path, "cancelled") | notes(tmp_path, "refused")) == len(started), 20,
               "every running request of the stream cancelled")
    wait_until(lambda: _flood_stub(backend)["in_flight"] == 0, 20, "no request in flight")
    wait_until(lambda: _flood_stub(backend)["s2p_used_bytes"] == 0 and _flood_stub(backend)["arena_used_bytes"] == 0,
               20, "both arenas of the stub empty")
    assert notes(tmp_path, "started") == started, "requests the client left unread were started after it left"


def _is_final(message: service_pb2.ModelStreamInferResponse) -> bool:
    assert not message.error_message, message.error_message
    return message.infer_response.parameters["triton_final_response"].bool_param


def test_a_reading_client_gets_every_pipelined_request_answered(backend: Backend, tmp_path: Path):
    requests = [flood_request(f"p{k}", tmp_path, 1024, count=3) for k in range(ONE_CLIENT_REQUESTS)]
    for request in requests:
        request.parameters["triton_enable_empty_final_response"].bool_param = True
    with grpc.insecure_channel(backend.grpc_url) as channel:
        method = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString)
        finals: set[str] = set()
        for message in method(iter(requests), timeout=120):
            if _is_final(message):
                finals.add(message.infer_response.id)
    assert finals == {request.id for request in requests}
    assert notes(tmp_path, "done") == finals
