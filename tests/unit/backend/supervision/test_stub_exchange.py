"""pystub_backend.backend.supervision (exchange, frames, stub_process): the request exchange's
`submit` and the one `send` over a real channel pair, real arenas and a real child process, with the
test playing the stub; and real stubs that fail to boot exiting with their named codes.

Inputs here are 4 KiB (above ipc.tensors.INLINE_BYTES: they go through the p2s arena) unless a
test says otherwise; small ones travel inline in the frame."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.features.install import feature_services
from pystub_backend.backend.inference import InferRequest, Tensor
from pystub_backend.backend.supervision.errors import StubStartError
from pystub_backend.backend.supervision.settings import StubSettings
from pystub_backend.backend.supervision.stub_process import StubProcess
from pystub_backend.ipc import spill, tensors
from pystub_backend.ipc.arena import ArenaReader, ArenaWriter
from pystub_backend.ipc.channel import BlockingChannel, ChannelTimeoutError, make_pair
from pystub_backend.ipc.exit_codes import StubExitCode
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.status import Status

_SLEEPER = "import sys, time; time.sleep(float(sys.argv[1])); sys.exit(int(sys.argv[2]))"


class Harness:
    """A StubProcess wired by hand to a peer channel the test drives, and to a child process that
    exits with a given code after a given time (what `alive` and `death_reason` read)."""

    def __init__(self, sleep: float = 60.0, code: int = 0, timeout: float = 0.3) -> None:
        self.stub = StubProcess("exchange_0", StubSettings(stub_timeout_seconds=timeout), "exchange",
                                feature_services(None))
        parent, child = make_pair()
        self.peer = BlockingChannel(child)
        stub = self.stub
        stub.p2s = ArenaWriter(stub.base, "p2s", 1 << 20, 1 << 20)
        stub.s2p = ArenaReader(stub.base, "s2p")
        stub.watch(subprocess.Popen([sys.executable, "-c", _SLEEPER, str(sleep), str(code)], start_new_session=True))
        stub.open_link(parent)  # arena segments ride on the frames both ways, as with a real stub
        assert stub.exchange is not None
        self.exchange = stub.exchange
        self.peer_p2s = ArenaReader(stub.base, "p2s")
        self.peer_s2p = ArenaWriter(stub.base, "s2p", 1 << 20, 1 << 20)
        self.peer.carry_segments(self.peer_s2p, self.peer_p2s)
        self.deaths: list[StubProcess] = []
        stub.on_death = self.deaths.append

    async def receive(self) -> object:
        frame = await asyncio.get_running_loop().run_in_executor(None, self.peer.recv, 5.0)
        assert frame is not None, "timed out waiting for a frame from the backend"
        return msg.decode(frame)

    async def close(self) -> None:
        self.peer.close()
        self.peer_p2s.close()
        self.peer_s2p.close()
        self.stub.kill()
        await self.stub.stop(finalize_timeout=0)


def _run(test: Callable[[Harness], Awaitable[None]], **kwargs: float) -> None:
    async def main() -> None:
        harness = Harness(**kwargs)
        try:
            await test(harness)
        finally:
            await harness.close()

    asyncio.run(main())


def _request(n: int = 1024) -> InferRequest:
    return InferRequest("exchange", inputs=[Tensor("IN", "FP32", (n,), np.ones(n, np.float32).tobytes())])


async def _executed(h: Harness, requests: list[InferRequest]) -> list[Any]:
    """Submit a batch that may wait for room; its outcomes once `execute` returned."""
    submission = h.exchange.submit(requests, wait=True)
    assert submission is not None
    await submission.executed()
    return submission.outcomes


def test_a_stub_that_dies_mid_request_fails_that_request_and_frees_its_inputs() -> None:
    async def test(h: Harness) -> None:
        assert h.stub.p2s is not None
        running = asyncio.ensure_future(_executed(h, [_request()]))
        execute = await h.receive()
        assert isinstance(execute, msg.Execute) and len(execute.requests) == 1
        assert h.stub.in_flight == 1 and h.stub.p2s.allocation_count == 1
        h.peer.close()  # the stub is gone with the request in flight
        streams = await asyncio.wait_for(running, 5.0)
        with pytest.raises(ServerError, match=r"Stub process 'exchange_0' is not healthy\."):
            await streams[0].single()  # type: ignore[union-attr]
        assert h.stub.in_flight == 0 and h.stub.p2s.allocation_count == 0
        assert h.deaths == [h.stub] and not h.stub.alive

    _run(test)


def test_inputs_are_kept_until_both_the_final_response_and_execute_done() -> None:
    async def test(h: Harness) -> None:
        assert h.stub.p2s is not None
        running = asyncio.ensure_future(_executed(h, [_request(), _request(2048)]))
        execute = await h.receive()
        assert isinstance(execute, msg.Execute)
        first, second = (wire[0] for wire in execute.requests)
        assert first != second, "one record per request id"
        # a decoupled model completes the first request from another thread, before execute returns
        h.peer.send(msg.encode(msg.Response([first, msg.RESPONSE_FINAL, None, [], None])), 1.0)
        await asyncio.sleep(0.05)
        assert h.stub.in_flight == 1, "the first request is complete"
        assert h.stub.p2s.allocation_count == 2, "its inputs stay until execute returned"
        h.peer.send(msg.encode(msg.ExecuteDone(execute.batch_id, [429, "model raised"], [])), 1.0)
        streams = await asyncio.wait_for(running, 5.0)
        assert (await streams[0].single()).error is None  # type: ignore[union-attr]
        with pytest.raises(ServerError, match="model raised"):
            await streams[1].single()  # type: ignore[union-attr]
        assert h.stub.in_flight == 0 and h.stub.p2s.allocation_count == 0

    _run(test)


def test_submit_sends_at_once_and_completes_at_execute_done() -> None:
    """EXECUTE is on its way when submit returns; the end of `execute` is heard at EXECUTE_DONE
    with the batch's timing complete, and the inputs are freed then."""
    async def test(h: Harness) -> None:
        assert h.stub.p2s is not None
        submission = h.exchange.submit([_request()], wait=False)
        assert submission is not None and submission.sent
        (stream,), timing = submission.outcomes, submission.timing
        ended: list[bool] = []
        submission.when_executed(lambda: ended.append(True))
        assert timing.compute_input_ns > 0 and not ended
        execute = await h.receive()  # sent already: nothing on the loop had to run for it
        assert isinstance(execute, msg.Execute) and len(execute.requests) == 1
        rid = execute.requests[0][0]
        h.peer.send(msg.encode(msg.ExecuteDone(execute.batch_id, None,
                                               [[rid, msg.RESPONSE_FINAL, None, [], "{}"]])), 1.0)
        await asyncio.wait_for(submission.executed(), 5.0)
        assert ended == [True] and timing.compute_infer_ns > 0
        assert (await stream.single()).error is None  # type: ignore[union-attr]
        assert h.stub.in_flight == 0 and h.stub.p2s.allocation_count == 0

    _run(test)


def test_small_tensors_travel_inline_both_ways_and_hold_no_arena_bytes() -> None:
    """A 16-byte input rides in the EXECUTE frame and a 16-byte output in EXECUTE_DONE: nothing is
    allocated in either arena, and releasing the response sends nothing."""
    async def test(h: Harness) -> None:
        assert h.stub.p2s is not None
        submission = h.exchange.submit([_request(4)], wait=False)
        assert submission is not None
        (stream,) = submission.outcomes
        execute = await h.receive()
        assert isinstance(execute, msg.Execute)
        (wire,) = execute.requests
        assert wire.inputs[0].handle == [tensors.INLINE_TAG, np.ones(4, np.float32).tobytes()]
        assert h.stub.p2s.allocation_count == 0
        output = tensors.place(h.peer_s2p, "OUT", "FP32", (4,), np.arange(4, dtype=np.float32), tensors.InlineBudget())
        assert output.handle[0] == tensors.INLINE_TAG and h.peer_s2p.allocation_count == 0
        h.peer.send(msg.encode(msg.ExecuteDone(execute.batch_id, None,
                                               [[wire.rid, msg.RESPONSE_FINAL, None, [list(output)], "{}"]])), 1.0)
        response = await asyncio.wait_for(stream.single(), 5.0)  # type: ignore[union-attr]
        assert np.frombuffer(response.outputs[0].data, np.float32).tolist() == [0.0, 1.0, 2.0, 3.0]
        response.release()
        h.exchange.submit([_request()], wait=False)  # the next EXECUTE would carry any release
        following = await h.receive()
        assert isinstance(following, msg.Execute) and following.releases == []

    _run(test)


def test_a_batch_of_inline_tensors_stays_within_the_frame_budget() -> None:
    async def test(h: Harness) -> None:
        assert h.stub.p2s is not None
        count = tensors.FRAME_INLINE_BYTES // tensors.INLINE_BYTES + 4  # more than one frame's budget
        submission = h.exchange.submit([_request(tensors.INLINE_BYTES // 4) for _ in range(count)], wait=False)
        assert submission is not None
        execute = await h.receive()
        assert isinstance(execute, msg.Execute)
        inline = [w for w in execute.requests if w.inputs[0].handle[0] == tensors.INLINE_TAG]
        assert len(inline) == tensors.FRAME_INLINE_BYTES // tensors.INLINE_BYTES
        assert h.stub.p2s.allocation_count == count - len(inline), "the rest go through p2s"

    _run(test)


def test_submit_keeps_nothing_when_the_stub_queue_is_full_and_may_not_wait() -> None:
    """A full queue: nothing is sent and nothing kept (no record, no p2s bytes), so the caller can
    queue the request instead."""
    async def test(h: Harness) -> None:
        assert h.stub.p2s is not None and h.stub.link is not None
        while h.stub.link.channel.try_send(msg.encode(msg.Cancel(list(range(5000))))):
            pass  # the peer does not read: fill its queue
        assert h.exchange.submit([_request()], wait=False) is None
        assert h.stub.in_flight == 0 and h.stub.p2s.allocation_count == 0
        assert h.exchange.requests() == []

    _run(test)


def test_submit_that_may_wait_sends_in_order_once_the_stub_reads_again() -> None:
    async def test(h: Harness) -> None:
        assert h.stub.link is not None
        while h.stub.link.channel.try_send(msg.encode(msg.Cancel([7]))):
            pass  # the peer does not read: fill its queue
        submission = h.exchange.submit([_request()], wait=True)
        assert submission is not None and submission.sent
        cancels = 0
        while True:  # the peer reads its queue: the waiting EXECUTE comes after every Cancel
            message = await h.receive()
            if not isinstance(message, msg.Cancel):
                break
            cancels += 1
        assert cancels > 0 and isinstance(message, msg.Execute) and len(message.requests) == 1
        rid = message.requests[0].rid
        h.peer.send(msg.encode(msg.ExecuteDone(message.batch_id, None,
                                               [[rid, msg.RESPONSE_FINAL, None, [], "{}"]])), 1.0)
        await asyncio.wait_for(submission.executed(), 5.0)
        assert (await submission.outcomes[0].single()).error is None  # type: ignore[union-attr]

    _run(test, timeout=10.0)


def test_submit_leaves_a_dead_stub_to_the_queue() -> None:
    async def test(h: Harness) -> None:
        h.peer.close()
        for _ in range(100):
            if not h.stub.alive:
                break
            await asyncio.sleep(0.01)
        assert h.exchange.submit([_request()], wait=False) is None
        waited = h.exchange.submit([_request()], wait=True)
        assert waited is not None and not waited.sent
        assert isinstance(waited.outcomes[0], ServerError)
        assert h.stub.p2s is not None and h.stub.p2s.allocation_count == 0

    _run(test)


def test_send_times_out_naming_the_message_and_the_stub() -> None:
    async def test(h: Harness) -> None:
        started = time.monotonic()
        with pytest.raises(ChannelTimeoutError, match=r"waiting to send Cancel to stub 'exchange_0'"):
            for _ in range(10_000):  # the peer never reads: its queue fills, then send waits 0.3 s
                await h.stub.send(msg.Cancel(list(range(5000))))
        assert time.monotonic() - started < 5.0

    _run(test)


def test_send_soon_never_blocks_and_keeps_the_order_through_a_full_queue() -> None:
    async def test(h: Harness) -> None:
        for token in range(200):  # 7 MB: far more than the channel's socket buffers (<= 2 x 1 MiB) hold
            h.stub.send_soon(msg.Cancel([token] + [2**40] * 4000))  # the rest wait in order
        # Nothing reads the peer until every call has returned, so a send_soon that waited for room
        # would wait out the timeout and drop its frame: `received` below would miss it. No clock.
        flushed = asyncio.ensure_future(h.stub.flush())
        await asyncio.sleep(0.05)
        assert not flushed.done(), "every frame fit the channel: the test never filled the queue"
        received = []
        for _ in range(200):
            message = await h.receive()
            assert isinstance(message, msg.Cancel)
            received.append(message.rids[0])
        await asyncio.wait_for(flushed, 5.0)
        assert received == list(range(200))

    _run(test, timeout=10.0)  # the queued frames wait at most this long for room: none is dropped


def test_death_reason_names_a_stub_exit_code() -> None:
    async def test(h: Harness) -> None:
        assert h.stub.process is not None
        h.stub.process.wait(timeout=10)
        assert h.stub.death_reason() == "exited with code 72 (INITIALIZE_FAILED)"
        assert h.stub.exit_code == StubExitCode.INITIALIZE_FAILED

    _run(test, sleep=0.0, code=int(StubExitCode.INITIALIZE_FAILED))


# -- real stubs that cannot boot ------------------------------------------------------------------
_RAISING_INIT = """
class TritonPythonModel:
    def initialize(self, args):
        raise ValueError("no weights here")

    def execute(self, requests):
        return []
"""


@pytest.mark.parametrize("source, code, text", [
    (_RAISING_INIT, StubExitCode.INITIALIZE_FAILED, "no weights here"),
    ("import module_that_is_not_there\n", StubExitCode.MODEL_IMPORT_FAILED, "module_that_is_not_there"),
])
def test_a_real_stub_that_cannot_boot_exits_with_its_code(tmp_path: Path, source: str, code: StubExitCode,
                                                          text: str, caplog: pytest.LogCaptureFixture) -> None:
    model = tmp_path / "model.py"
    model.write_text(source)

    caplog.set_level(logging.INFO, logger="pystub.stub")  # where the ladder says each signal it sends

    async def main() -> None:
        stub = StubProcess("boot_0", StubSettings(), "boot", feature_services(None))
        stub.spawn()
        try:
            with pytest.raises(StubStartError, match=text) as raised:
                await stub.initialize(str(model), {"model_name": "boot", "model_version": "1"}, {})
            assert raised.value.boot_failure
            await stub.stop(finalize_timeout=0)
            # Its own exit code, not a signal's: it exited by itself, no SIGTERM/SIGKILL ladder (a
            # time bound said the same but failed on a loaded machine: the boot alone took 3 s).
            assert stub.exit_code == code, stub.death_reason()
            assert not [r for r in caplog.records if r.getMessage().startswith("sending SIG")], caplog.text
        finally:
            await stub.stop(finalize_timeout=0)

    asyncio.run(main())


def test_a_stub_started_with_bad_arguments_exits_with_bad_arguments() -> None:
    result = subprocess.run([sys.executable, "-m", "pystub_backend.stub.triton_python_backend_stub", "x_0",
                             "--fd", "not-a-number"], capture_output=True, timeout=60)
    assert result.returncode == StubExitCode.BAD_ARGUMENTS, result.stderr
    assert b"--fd" in result.stderr or b"--base" in result.stderr, "argparse says what is wrong"


# -- frames over the channel's limit ----------------------------------------------
def test_an_oversize_request_travels_spilled_in_p2s_and_is_freed_on_release() -> None:
    async def test(h: Harness) -> None:
        assert h.stub.p2s is not None
        big = _request()
        big.id = "i" * 200_000  # over MAX_FRAME on its own
        running = asyncio.ensure_future(_executed(h, [_request(), big]))
        spilled = await h.receive()
        assert isinstance(spilled, msg.Spilled), "the frame travels in the arena"
        assert h.stub.p2s.allocation_count == 3  # two inputs and the frame
        execute = spill.unspill(spilled, h.peer_p2s, lambda handle: None)  # released below, by frame
        assert isinstance(execute, msg.Execute) and [w.id for w in execute.requests] == ["", big.id]
        h.peer.send(msg.encode(msg.Release([spilled.handle], [])), 1.0)  # the stub read it
        await asyncio.sleep(0.05)
        assert h.stub.p2s.allocation_count == 2
        responses = [[wire.rid, msg.RESPONSE_FINAL, None, [], "{}"] for wire in execute.requests]
        h.peer.send(msg.encode(msg.ExecuteDone(execute.batch_id, None, responses)), 1.0)
        streams = await asyncio.wait_for(running, 5.0)
        for stream in streams:
            assert (await stream.single()).error is None  # type: ignore[union-attr]
        assert h.stub.in_flight == 0 and h.stub.p2s.allocation_count == 0

    _run(test)


def test_a_request_the_wire_cannot_carry_fails_alone_and_frees_what_it_held() -> None:
    async def test(h: Harness) -> None:
        assert h.stub.p2s is not None
        bad = _request()
        bad.correlation_id = 1 << 70  # msgpack carries at most 64 bits
        running = asyncio.ensure_future(_executed(h, [_request(), bad, _request(2048)]))
        execute = await h.receive()
        assert isinstance(execute, msg.Execute) and len(execute.requests) == 2, "the others are sent"
        assert h.stub.p2s.allocation_count == 2, "the refused request's input is freed at once"
        responses = [[wire.rid, msg.RESPONSE_FINAL, None, [], "{}"] for wire in execute.requests]
        h.peer.send(msg.encode(msg.ExecuteDone(execute.batch_id, None, responses)), 1.0)
        streams = await asyncio.wait_for(running, 5.0)
        assert (await streams[0].single()).error is None  # type: ignore[union-attr]
        with pytest.raises(ServerError, match="could not be sent") as error:
            await streams[1].single()  # type: ignore[union-attr]
        assert error.value.status == Status.INVALID_ARG
        assert (await streams[2].single()).error is None  # type: ignore[union-attr]
        assert h.stub.in_flight == 0 and h.stub.p2s.allocation_count == 0

    _run(test)


def test_an_oversize_frame_from_the_stub_is_read_from_s2p_and_released(caplog: pytest.LogCaptureFixture) -> None:
    async def test(h: Harness) -> None:
        text = "L" * 300_000
        frame, handle = spill.spill(msg.encode(msg.Log(1, text, "model.py", 7)), h.peer_s2p)
        with caplog.at_level(logging.WARNING, logger="pystub.stub"):
            h.peer.send(frame, 1.0)  # the new s2p segment rides on this frame
            release = await h.receive()
        assert isinstance(release, msg.Release) and release.handles == [list(handle)]
        (record,) = [r for r in caplog.records if r.lineno == 7]
        assert record.getMessage() == f"[exchange_0] {text}" and record.pathname == "model.py"

    _run(test)


def test_the_release_of_a_final_response_rides_on_the_next_execute() -> None:
    """No RELEASE frame per response: the s2p bytes of a final response (no credit: the stub has
    forgotten the request) go with the next EXECUTE; alone, they go out after RIDE_SECONDS."""
    async def test(h: Harness) -> None:
        async def answered(rows: int) -> tuple[list[int], object]:  # rows: above INLINE_BYTES, in s2p
            submission = h.exchange.submit([_request()], wait=False)
            assert submission is not None
            (stream,) = submission.outcomes
            execute = await h.receive()
            assert isinstance(execute, msg.Execute)
            output = tensors.place(h.peer_s2p, "OUT", "FP32", (rows,), np.ones(rows, np.float32).tobytes())
            h.peer.send(msg.encode(msg.ExecuteDone(execute.batch_id, None, [
                [execute.requests[0][0], msg.RESPONSE_FINAL, None, [list(output)], "{}"]])), 1.0)
            response = await stream.single()  # type: ignore[union-attr]
            response.release()
            return list(output.handle), execute

        first, _ = await answered(1024)
        _, second = await answered(2048)
        assert isinstance(second, msg.Execute) and second.releases == [first], "carried by the next EXECUTE"
        third, _ = await answered(512)
        waited = time.monotonic()
        release = await h.receive()  # nothing else is sent: the release goes alone, a moment later
        assert isinstance(release, msg.Release) and release.handles == [third] and release.credits == []
        assert time.monotonic() - waited < 1.0

    _run(test)
