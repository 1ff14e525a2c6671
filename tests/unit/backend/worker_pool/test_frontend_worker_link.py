"""The core link's records and framing (frontends/workers/link.py) and the worker pool's
supervision (pool.py) against real child processes that stand in for workers."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from pystub_backend.backend.frontends.workers.link import (
    FrameProtocol,
    pack,
    request_from_record,
    request_record,
    response_from_record,
    response_record,
)
from pystub_backend.backend.inference import InferRequest, InferResponse, RequestedOutput, Tensor
from pystub_backend.backend.supervision.settings import StubSettings
from pystub_backend.backend.worker_pool.pool import WorkerPool, WorkerStartError
from pystub_backend.ipc.messages.core import Finalize
from pystub_backend.ipc.messages.workers import (
    LinkRequest,
    LinkTrace,
    WorkerAnswer,
    WorkerError,
    WorkerHello,
    WorkerInfer,
)
from pystub_backend.ipc.records import WireError
from pystub_backend.ipc.wire import to_array as encode_array_of


def test_a_request_crosses_the_link_unchanged() -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    request = InferRequest("m", "2", "id-7", [Tensor("IN", "FP32", (2, 3), data, {"shared_memory_region": "r"})],
                           [RequestedOutput("OUT", {"binary_data": True})], {"sequence_id": 5, "x-h": "v"})
    trace = LinkTrace("00-abc-01", 10, 20)
    received = _messages(pack(WorkerInfer(3, "HTTP", request_record(request), trace)))[0]
    assert type(received) is WorkerInfer and type(received.request) is LinkRequest and received.trace == trace
    back = request_from_record(received.request)
    assert (back.model_name, back.model_version, back.id, back.parameters) == ("m", "2", "id-7", request.parameters)
    assert [(t.name, t.datatype, t.shape, bytes(t.data), t.parameters) for t in back.inputs] == [
        ("IN", "FP32", (2, 3), data.tobytes(), {"shared_memory_region": "r"})]
    assert [(o.name, o.parameters) for o in back.outputs] == [("OUT", {"binary_data": True})]


@pytest.mark.parametrize("value", [2 ** 70, -(2 ** 70), 2 ** 64, -(2 ** 63) - 1, "\ud800", "a\udfffb", 1.5, True])
def test_what_json_may_decode_to_crosses_the_link_exactly(value: object) -> None:
    """Ints past 64 bits and lone surrogates: the core must see what an in-process frontend would."""
    request = InferRequest(f"m{value}" if isinstance(value, str) else "m", "", "id" + str(value),
                           [Tensor("IN", "BYTES", (1,), b"x", {"p": value})], [RequestedOutput("OUT", {"q": value})],
                           {"sequence_id": value, "timeout": value})
    back = request_from_record(_messages(pack(WorkerInfer(1, "GRPC", request_record(request), None)))[0].request)
    assert (back.model_name, back.id, back.parameters) == (request.model_name, request.id, request.parameters)
    assert back.inputs[0].parameters == {"p": value} and back.outputs[0].parameters == {"q": value}
    assert type(back.parameters["timeout"]) is type(value)
    error = _messages(pack(WorkerError(1, WireError(400, f"bad {value}"))))[0]
    assert error.error == WireError(400, f"bad {value}")


def test_a_response_is_copied_out_before_release() -> None:
    arena = bytearray(b"\x01\x00\x00\x00\x02\x00\x00\x00")
    response = InferResponse("m", "1", "id", [Tensor("OUT", "INT32", (2,), memoryview(arena))], {"p": 1})
    record = response_record(response)
    arena[:] = bytes(8)  # what a released arena slot may hold next
    back = response_from_record(_messages(pack(WorkerAnswer(9, record)))[0].response)
    assert np.frombuffer(back.outputs[0].data, np.int32).tolist() == [1, 2]
    assert (back.model_name, back.model_version, back.id, back.parameters) == ("m", "1", "id", {"p": 1})


def test_frames_split_anywhere_are_reassembled_in_order() -> None:
    stream = b"".join(pack(WorkerError(n, WireError(500, "x" * (n * 100)))) for n in range(20))
    pieces = [stream[i:i + 7] for i in range(0, len(stream), 7)]
    assert [message.id for message in _messages(*pieces)] == list(range(20))


@pytest.mark.parametrize("bad, why", [
    (msgpack.packb([1, 2]), "message AutoComplete has 1 fields, expected 2"),
    (msgpack.packb(encode_array_of(Finalize())), "Finalize message is not a core link message"),
    (msgpack.packb([72, "one", True]), "has a field 'id' of type str"),
    (msgpack.packb({"k": "hello"}), "not a message array"),
])
def test_a_frame_that_is_not_a_link_message_closes_the_link(bad: bytes, why: str,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    protocol = _Collect()
    transport = _Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol.data_received(pack(WorkerHello(0, 7)) + bad + pack(WorkerHello(1, 8)))
    assert transport.closed and protocol.messages == [WorkerHello(0, 7)]
    assert why in caplog.text


class _Transport:
    closed = False

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class _Collect(FrameProtocol):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[Any] = []

    def message_received(self, message: Any) -> None:
        self.messages.append(message)


def _messages(*chunks: bytes) -> list[Any]:
    protocol = _Collect()
    for chunk in chunks:
        protocol.data_received(chunk)
    return protocol.messages


# -- the pool, with `python -c` children standing in for workers ---------------------------------


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


async def _serving_pool(code: str, count: int = 2) -> tuple[WorkerPool, list[asyncio.Task[None]]]:
    """A pool whose children say hello (as a worker does over the link) once they run."""
    pool = WorkerPool(count, lambda index: _child(code), grace=2.0, restarts=StubSettings())
    hellos: list[asyncio.Task[None]] = []

    async def announce() -> None:  # the link's part: tell the pool each new child serves
        seen: set[int] = set()
        while True:
            for index, process in pool._processes.items():  # noqa: SLF001 - the test plays the link
                if process.pid not in seen and process.returncode is None:
                    seen.add(process.pid)
                    pool.serving(index, process.pid)
            await asyncio.sleep(0.02)

    hellos.append(asyncio.ensure_future(announce()))
    return pool, hellos


def test_the_pool_starts_restarts_and_stops_its_workers() -> None:
    async def main() -> None:
        pool, hellos = await _serving_pool("import time; time.sleep(60)")
        try:
            await pool.start(30)
            first = pool.pids
            assert sorted(first) == [0, 1]
            os.kill(first[0], 9)
            deadline = time.monotonic() + 30
            while pool.pids.get(0) in (None, first[0]):
                assert time.monotonic() < deadline, "worker 0 was not started again"
                await asyncio.sleep(0.05)
            assert pool.pids[1] == first[1]
        finally:
            await pool.stop()
            for task in hellos:
                task.cancel()
        assert pool.pids == {}
        assert all(process.returncode is not None for process in pool._processes.values())  # noqa: SLF001

    asyncio.run(main())


def test_a_worker_that_never_listens_fails_the_start_with_a_named_deadline() -> None:
    async def main() -> None:
        pool = WorkerPool(1, lambda index: _child("import time; time.sleep(60)"), grace=1.0, restarts=StubSettings())
        try:
            with pytest.raises(WorkerStartError, match=r"timed out after 1 s waiting for frontend workers \[0\]"):
                await pool.start(1.0)
        finally:
            await pool.stop()

    asyncio.run(main())


def test_stop_kills_a_worker_that_ignores_sigterm(tmp_path: Path) -> None:
    mark = tmp_path / "ignoring"

    async def main() -> None:
        code = (f"import pathlib, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                f"pathlib.Path({str(mark)!r}).touch(); time.sleep(60)")
        pool, hellos = await _serving_pool(code, count=1)
        pool._grace = 0.2  # noqa: SLF001 - a short grace for the test
        await pool.start(30)
        deadline = time.monotonic() + 30
        while not mark.exists():  # SIGTERM before the handler is in place would just end it
            assert time.monotonic() < deadline, "the child never ignored SIGTERM"
            await asyncio.sleep(0.02)
        started = time.monotonic()
        await pool.stop()
        for task in hellos:
            task.cancel()
        assert time.monotonic() - started < 15
        assert all(process.returncode == -9 for process in pool._processes.values())  # noqa: SLF001

    asyncio.run(main())
