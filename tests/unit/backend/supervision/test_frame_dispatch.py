"""The backend's frame dispatcher (supervision/frames.FrameLink) over a real channel: each kind a
stub sends reaches its one consumer (the request exchange, a feature's handler, a reply waiter),
and a frame of a kind only the backend sends is logged and reaches none of them."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

import pytest

from pystub_backend.backend.supervision.frames import FrameLink
from pystub_backend.backend.supervision.handlers import BackendHandlers
from pystub_backend.ipc import names
from pystub_backend.ipc.arena import ArenaReader, ArenaWriter
from pystub_backend.ipc.channel import BlockingChannel, make_pair
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.messages.multiplex import MultiplexLoaded, MultiplexUsage
from pystub_backend.ipc.records import WireResponse

DEADLINE_SECONDS = 10.0


class _Exchange:
    """The request exchange's side of the dispatch: what it was handed, in order."""

    def __init__(self, link: FrameLink) -> None:
        self.seen: list[tuple[str, object]] = []
        link.route(msg.Response, lambda message: self.seen.append(("response", message.response)))
        link.route(msg.ExecuteDone, lambda message: self.seen.append(("execute_done", message)))
        link.route(msg.Release, lambda message: self.seen.append(("free_p2s", message.handles)))


class _Stub:
    """What feature handlers are given as the stub that sent a frame (a real one needs a model
    process): a link over a real channel and real arenas, the request exchange's routes, and the
    features' handlers bound to this stub."""

    instance_name = "dispatch_test_0"

    def __init__(self, handlers: BackendHandlers, sock: Any) -> None:
        base = names.stub_base_name("pystub_test")
        self.p2s = ArenaWriter(base, "p2s", 1 << 16, 1 << 16)
        self.s2p = ArenaReader(base, "s2p")
        self.link = FrameLink(sock, self.instance_name, DEADLINE_SECONDS, self.p2s, self.s2p, self.death_text,
                              lambda: None)
        self.exchange = _Exchange(self.link)

        def feature(kind: type) -> Callable[[Any], None] | None:
            handler = handlers.frame_handler(kind)
            return None if handler is None else functools.partial(handler, self)

        self.link.route_features(feature)

    def death_text(self, what: str) -> str:
        return f"stub '{self.instance_name}' went away while waiting for {what}"

    def close(self) -> None:
        self.link.close()
        self.p2s.close()
        self.s2p.close()


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + DEADLINE_SECONDS
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def _dispatch(frames: list[Any], settled: Callable[[_Stub, list[Any]], bool]) -> tuple[_Stub, list[Any]]:
    """Send `frames` from the stub's end of a channel pair; returns the stub once `settled`, and
    what the feature handlers were given."""
    handled: list[Any] = []
    handlers = BackendHandlers()
    handlers.on_frame(MultiplexLoaded, lambda stub, message: handled.append((stub, message)))
    handlers.on_frame(MultiplexUsage, lambda stub, message: handled.append((stub, message)))
    backend_end, stub_end = make_pair()
    stub = _Stub(handlers, backend_end)
    sender = BlockingChannel(stub_end)
    try:
        for frame in frames:
            sender.send(msg.encode(frame), DEADLINE_SECONDS)
        await _until(lambda: settled(stub, handled), "the frames to be dispatched")
    finally:
        stub.close()
        sender.close()
    return stub, handled


def test_each_kind_reaches_its_one_consumer() -> None:
    response = WireResponse(7, msg.RESPONSE_FINAL, None, [], None)
    frames = [msg.Response(response), MultiplexLoaded("sub-a", 0.25), msg.Release([[0, 64, 8]], []),
              MultiplexUsage(3, 1, ["sub-a"]), msg.ExecuteDone(4, None, [])]
    stub, handled = asyncio.run(_dispatch(frames, lambda stub, handled: len(stub.exchange.seen) == 3
                                          and len(handled) == 2))
    assert stub.exchange.seen == [("response", response), ("free_p2s", [[0, 64, 8]]),
                                  ("execute_done", msg.ExecuteDone(4, None, []))]
    assert handled == [(stub, MultiplexLoaded("sub-a", 0.25)), (stub, MultiplexUsage(3, 1, ["sub-a"]))]
    assert type(handled[0][1]) is MultiplexLoaded  # decoded into its named class, not a bare tuple


def test_a_kind_only_the_backend_sends_is_logged_and_dropped(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="pystub.stub")
    # The Execute comes first: the link dispatches in order, so once the Loaded is handled the
    # Execute has been judged.
    frames = [msg.Execute(1, [], []), msg.Cancel([5]), MultiplexLoaded("sub-b", 0.5)]
    stub, handled = asyncio.run(_dispatch(frames, lambda stub, handled: len(handled) == 1))
    assert stub.exchange.seen == [] and handled == [(stub, MultiplexLoaded("sub-b", 0.5))]
    unexpected = [r.getMessage() for r in caplog.records if r.getMessage().startswith("unexpected")]
    assert unexpected == ["unexpected Execute from stub 'dispatch_test_0'",
                          "unexpected Cancel from stub 'dispatch_test_0'"]


def test_a_reply_reaches_the_caller_that_waits_for_it() -> None:
    async def scenario() -> msg.IsReadyDone:
        backend_end, stub_end = make_pair()
        stub = _Stub(BackendHandlers(), backend_end)
        sender = BlockingChannel(stub_end)
        try:
            waiting = asyncio.ensure_future(stub.link.await_reply(msg.IsReadyDone, DEADLINE_SECONDS, "IS_READY"))
            await asyncio.sleep(0)  # the waiter is registered before the reply is sent
            sender.send(msg.encode(msg.IsReadyDone(9, True, None)), DEADLINE_SECONDS)
            return await waiting
        finally:
            stub.close()
            sender.close()

    assert asyncio.run(scenario()) == msg.IsReadyDone(9, True, None)
