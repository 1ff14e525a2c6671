"""The h2 stack gives a closed connection's freed memory back: one trim per burst of closes of
connections that carried much, none for small ones; on real sockets with grpcio's client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import grpc
import pytest
from h2_server import RunningH2Server
from test_grpc_h2_calls import _SERVICE, _handlers, _Probe

from pystub_backend.backend.frontends.grpc.h2.heap import TRIM_AFTER_BYTES, HeapTrimmer

_WAIT = 10.0


def test_closes_in_one_burst_ask_for_one_trim() -> None:
    trims: list[float] = []

    async def burst() -> None:
        trimmer = HeapTrimmer(lambda: trims.append(time.monotonic()))
        for _ in range(5):
            trimmer.released()
        deadline = time.monotonic() + _WAIT
        while not trims and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        trimmer.released()  # within the interval: waits for it, then one more
        while len(trims) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        trimmer.cancel()

    asyncio.run(burst())
    assert len(trims) == 2, trims
    assert trims[1] - trims[0] >= 0.9, "a second trim came sooner than the interval"


@pytest.fixture
def server() -> Iterator[RunningH2Server]:
    running = RunningH2Server({"grpc.max_receive_message_length": -1}, {_SERVICE: _handlers(_Probe())})
    try:
        yield running
    finally:
        running.close()


def _trims_after(server: RunningH2Server, payload: bytes) -> int:
    """Trims counted after one connection echoes `payload` and closes (waits for the one it causes)."""
    options = [("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(f"127.0.0.1:{server.port}", options=options) as channel:
        assert channel.unary_unary(f"/{_SERVICE}/Echo")(payload, timeout=_WAIT) == payload
    heap = server.server._state.heap
    deadline = time.monotonic() + 3.0  # settle (0.1 s) and the loop's turn; a small connection never trims
    while time.monotonic() < deadline and heap.trims == 0:
        time.sleep(0.05)
    return heap.trims


def test_a_connection_that_carried_much_trims_when_it_closes(server: RunningH2Server) -> None:
    assert _trims_after(server, bytes(TRIM_AFTER_BYTES)) == 1


def test_a_small_connection_does_not_trim(server: RunningH2Server) -> None:
    assert _trims_after(server, b"small") == 0
