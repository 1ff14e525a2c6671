"""ReadyProbe against a fake stub: one call at a time, checks share it, answers match their call."""

from __future__ import annotations

import asyncio

import pytest

from pystub_backend.backend.supervision.errors import StubStartError
from pystub_backend.backend.supervision.ready_probe import TIMED_OUT, ReadyProbe
from pystub_backend.ipc.messages import core as msg


class FakeStub:
    """Answers IsReady calls when the test says so; replies may be stale (an earlier token)."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.replies: asyncio.Queue[msg.IsReadyDone] = asyncio.Queue()

    async def request_reply(self, message: object, reply: type, timeout: float, what: str) -> object:
        assert isinstance(message, msg.IsReady) and reply is msg.IsReadyDone
        self.sent.append(message.token)
        return await self.await_reply(reply, timeout, what)

    async def await_reply(self, kind: type, timeout: float, what: str) -> object:
        try:
            return await asyncio.wait_for(self.replies.get(), timeout)
        except asyncio.TimeoutError:
            raise StubStartError(f"timed out after {timeout:.0f} s waiting for {what}") from None


def test_checks_during_a_slow_call_wait_for_it_and_get_its_answer():
    async def scenario() -> None:
        stub = FakeStub()
        probe = ReadyProbe(stub, "fake_0_0", call_timeout=30)
        assert await probe.check(answer_timeout=0.05) == TIMED_OUT
        second = asyncio.ensure_future(probe.check(answer_timeout=5))
        await asyncio.sleep(0.05)
        assert stub.sent == [1]  # the second check did not call again
        stub.replies.put_nowait(msg.IsReadyDone(1, False, "not yet"))
        assert await second == "not yet"
        third = asyncio.ensure_future(probe.check(answer_timeout=5))
        await asyncio.sleep(0.01)
        stub.replies.put_nowait(msg.IsReadyDone(2, True, None))
        assert await third is None
        assert stub.sent == [1, 2] and probe.calls == 2

    asyncio.run(scenario())


def test_a_late_answer_of_a_given_up_call_answers_nothing():
    async def scenario() -> None:
        stub = FakeStub()
        probe = ReadyProbe(stub, "fake_0_0", call_timeout=0.1)
        assert await probe.check(answer_timeout=1) == TIMED_OUT  # call 1 given up after its own deadline
        check = asyncio.ensure_future(probe.check(answer_timeout=1))
        await asyncio.sleep(0.01)
        stub.replies.put_nowait(msg.IsReadyDone(1, True, None))  # call 1's answer, too late
        stub.replies.put_nowait(msg.IsReadyDone(2, False, "call 2 says no"))
        assert await check == "call 2 says no"
        assert stub.sent == [1, 2]

    asyncio.run(scenario())


@pytest.mark.parametrize("failure, text", [
    (StubStartError("stub process 'fake_0_0' exited with code 1 while waiting for is_ready"),
     "Stub process 'fake_0_0' is not healthy."),
])
def test_a_dead_stub_is_not_ready(failure: StubStartError, text: str):
    class DeadStub(FakeStub):
        async def request_reply(self, message: object, reply: type, timeout: float, what: str) -> object:
            raise failure

    async def scenario() -> None:
        assert await ReadyProbe(DeadStub(), "fake_0_0", call_timeout=1).check() == text

    asyncio.run(scenario())
