"""Clients that never read their streams hold a bounded amount of the server's memory each, and
give it back when they leave (docs/hostile-input.md, "Streams whose client does not read").

Forty gRPC streams (twenty SSE connections: their JSON costs CPU) ask the `flood` model for 64 KiB
(16 KiB) responses without end and never read. Once every request's send window in the stub is
full, the RSS growth of the backend, the stubs and the workers stays within a few MiB per stream
(before the windows counted bytes and the gRPC writer's queue was bounded in bytes, each stream
held 64 responses in the stub and 64 more in the frontend: about 8 MiB). When the clients leave,
every request is cancelled, the arenas are empty again and nothing stays in flight; a second wave
costs next to nothing more."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Backend, make_repository
from stream_clients import GrpcStream, Memory, SseStream, flood_request, notes, wait_until

SHAPES = {"grpc": (40, 64 << 10), "sse": (20, 16 << 10)}  # streams, bytes per response
WINDOW_BYTES = 256 << 10  # pystub_backend.stub.senders.WINDOW_BYTES
PER_STREAM_MIB = {"backend": 2.0, "stubs": 1.0, "workers": 2.0}  # generous: the documented bound is below
SECOND_WAVE_MIB = 24.0  # allocator noise; a leak of the first wave's windows would be ~40 MiB


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
