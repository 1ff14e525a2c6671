"""Segment descriptors on the channel (ipc/channel.py + ipc/arena.py) over a real socket pair:
they ride on the next frame after the growth, survive a send that found the queue full, arrive
close-on-exec, are mapped before the frame is handed on, and a peer cannot slip in anything that
is not a sealed segment."""

from __future__ import annotations

import array
import asyncio
import os
import socket
import tempfile

import pytest

from pystub_backend.ipc.arena import ArenaReader, ArenaWriter
from pystub_backend.ipc.channel import AsyncChannel, BlockingChannel, ChannelTimeoutError, make_pair
from pystub_backend.ipc.segment import SegmentCreateError

PAGE = 4096


class RecordingSink(ArenaReader):
    """An ArenaReader that also records whether each arriving descriptor was close-on-exec."""

    def __init__(self) -> None:
        super().__init__("pystub_test", "p2s")
        self.inheritable: list[bool] = []

    def add_fds(self, fds: list[int]) -> None:
        self.inheritable += [os.get_inheritable(fd) for fd in fds]
        super().add_fds(fds)


def test_a_new_segment_rides_on_the_next_frame_and_is_mapped_before_it_is_returned() -> None:
    left, right = make_pair()
    writer, sink = ArenaWriter("pystub_test", "p2s", PAGE, PAGE), RecordingSink()
    sender, receiver = BlockingChannel(left), BlockingChannel(right)
    sender.carry_segments(writer, ArenaReader("pystub_test", "s2p"))
    receiver.carry_segments(ArenaWriter("pystub_test", "s2p", PAGE, PAGE), sink)
    try:
        first = writer.write(b"a" * 100)
        second = writer.write(b"b" * (2 * PAGE))  # a second segment
        sender.send(b"frame naming both", 1.0)
        assert receiver.recv(1.0) == b"frame naming both"
        assert sink.segment_count == 2 and sink.inheritable == [False, False]
        assert bytes(sink.view(first)) == b"a" * 100 and bytes(sink.view(second)) == b"b" * (2 * PAGE)
        sender.send(b"no growth", 1.0)
        assert receiver.recv(1.0) == b"no growth" and sink.segment_count == 2
    finally:
        for end in (sender, receiver, writer, sink):
            end.close()


def test_descriptors_of_a_send_that_found_the_queue_full_go_with_the_next_frame() -> None:
    left, right = make_pair()
    writer, sink = ArenaWriter("pystub_test", "p2s", PAGE, PAGE), RecordingSink()
    sender, receiver = BlockingChannel(left), BlockingChannel(right)
    sender.carry_segments(writer, ArenaReader("pystub_test", "s2p"))
    receiver.carry_segments(ArenaWriter("pystub_test", "s2p", PAGE, PAGE), sink)
    try:
        filler = b"f" * 60_000
        sent = 0
        with pytest.raises(ChannelTimeoutError, match="filler"):
            while True:
                sender.send(filler, 0.05, "filler")
                sent += 1
        handle = writer.write(b"late segment")
        with pytest.raises(ChannelTimeoutError):
            sender.send(b"names the late segment", 0.05)  # full: the descriptor stays queued
        for _ in range(sent):
            assert receiver.recv(1.0) == filler
        assert sink.segment_count == 0
        sender.send(b"names the late segment", 1.0)
        assert receiver.recv(1.0) == b"names the late segment"
        assert bytes(sink.view(handle)) == b"late segment"
    finally:
        for end in (sender, receiver, writer, sink):
            end.close()


def test_the_backends_async_end_carries_segments_both_ways() -> None:
    async def main() -> None:
        parent, child = make_pair()
        p2s, s2p_reader = ArenaWriter("pystub_test", "p2s", PAGE, PAGE), ArenaReader("pystub_test", "s2p")
        s2p, p2s_reader = ArenaWriter("pystub_test", "s2p", PAGE, PAGE), ArenaReader("pystub_test", "p2s")
        frames: list[bytes] = []
        arrived = asyncio.Event()
        backend = AsyncChannel(parent, lambda f: (frames.append(f), arrived.set()), lambda: None)
        backend.carry_segments(p2s, s2p_reader)
        stub = BlockingChannel(child)
        stub.carry_segments(s2p, p2s_reader)
        try:
            handle = p2s.write(b"input")
            await backend.send(b"execute", 1.0)
            frame = await asyncio.get_running_loop().run_in_executor(None, stub.recv, 1.0)
            assert frame == b"execute" and bytes(p2s_reader.view(handle)) == b"input"
            output = s2p.write(b"output")
            stub.send(b"response", 1.0)
            await asyncio.wait_for(arrived.wait(), 5.0)
            assert frames == [b"response"] and bytes(s2p_reader.view(output)) == b"output"
        finally:
            backend.close()
            for end in (stub, p2s, s2p, s2p_reader, p2s_reader):
                end.close()

    asyncio.run(main())


def test_a_peer_cannot_slip_in_a_file_or_shift_later_segments() -> None:
    left, right = make_pair()
    sink = RecordingSink()
    receiver = BlockingChannel(right)
    receiver.carry_segments(ArenaWriter("pystub_test", "s2p", PAGE, PAGE), sink)
    writer = ArenaWriter("pystub_test", "p2s", PAGE, PAGE)
    try:
        with tempfile.TemporaryFile() as plain:
            plain.write(b"x" * PAGE)
            plain.flush()
            left.sendmsg([b"a file"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [plain.fileno()]))])
        assert receiver.recv(1.0) == b"a file"
        handle = writer.write(b"real")  # the writer's segment 0 arrives as the reader's index 1
        [fd] = writer.take_new_fds()
        left.sendmsg([b"a segment"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
        os.close(fd)
        assert receiver.recv(1.0) == b"a segment"
        with pytest.raises(SegmentCreateError, match="not an anonymous segment"):
            sink.view((0, 0, 1))
        assert bytes(sink.view((1, handle[1], handle[2]))) == b"real"
    finally:
        left.close()
        for end in (receiver, writer, sink):
            end.close()


def test_closing_a_channel_closes_descriptors_that_never_went_out() -> None:
    left, right = make_pair()
    writer = ArenaWriter("pystub_test", "p2s", PAGE, PAGE)
    sender = BlockingChannel(left)
    sender.carry_segments(writer, ArenaReader("pystub_test", "s2p"))
    right.close()
    writer.write(b"x")
    with pytest.raises(ConnectionError):
        sender.send(b"to nobody", 0.5)
    sender.close()  # the queued descriptor is closed here; the leak check would see it otherwise
    writer.close()


_AT_THE_LIMIT = r'''
import array, os, resource, socket, sys
from pystub_backend.ipc.channel import BlockingChannel, ChannelClosedError, make_pair
left, right = make_pair()
receiver = BlockingChannel(right)
spare = [os.open("/dev/null", os.O_RDONLY) for _ in range(2)]
left.sendmsg([b"frame"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", spare))])
# No descriptor slot left for what the frame carries: the kernel drops them (MSG_CTRUNC).
highest = max(os.listdir("/proc/self/fd"), key=int)
resource.setrlimit(resource.RLIMIT_NOFILE, (int(highest) + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
try:
    receiver.recv(5.0)
except ChannelClosedError as exc:
    print(exc)
    sys.exit(0)
print("a frame whose descriptors were dropped was handed on")
sys.exit(1)
'''


def test_descriptors_dropped_at_the_descriptor_limit_close_the_channel() -> None:
    """A receiver at its descriptor limit gets a frame without the segments it carried: every later
    segment would take a wrong index (and map the wrong memory), so the channel ends, saying why."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", _AT_THE_LIMIT], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "MSG_CTRUNC" in result.stdout, result.stdout
