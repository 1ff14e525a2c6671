"""Small frames to a stub that can wait a moment and travel together: releases of s2p memory,
send credits, cancellations.

They are batched within one event-loop turn and sent with a non-blocking send; releases also ride
on the next EXECUTE frame. A full queue is retried shortly rather than awaited, so nothing on the
loop ever blocks on a slow stub.

Releases alone (the s2p bytes of a request's final response: no credit goes with it, the stub has
forgotten the request) wait up to `RIDE_SECONDS` for an EXECUTE to carry them: under load one
frame each way per request fewer, for the backend to encode and send and for the stub to read.
A credit or a cancel is sent in the same loop turn, and takes the waiting releases along.
"""

from __future__ import annotations

import asyncio

from pystub_backend.ipc.channel import AsyncChannel, ChannelClosedError
from pystub_backend.ipc.messages import core as msg

__all__ = ["StubOutbox"]

_CHUNK = 2048
RIDE_SECONDS = 0.002  # how long releases alone wait for an EXECUTE frame to carry them


class StubOutbox:
    def __init__(self, channel: AsyncChannel) -> None:
        self._channel = channel
        self._loop = asyncio.get_running_loop()
        self.releases: list[list[int]] = []  # pending: an EXECUTE frame takes them along
        self._credits: list[int] = []
        self._cancels: list[int] = []
        self._flush_handle: asyncio.Handle | None = None
        self._flush_delayed = False  # the pending flush is a timer (not the next loop turn)
        self.closed = False

    def release(self, handles: list[list[int]], credit_rid: int | None = None) -> None:
        """Free `handles` in s2p; with `credit_rid`, return a send credit of that request (now)."""
        if self.closed:
            return
        self.releases.extend(h for h in handles if h[0] >= 0)
        if credit_rid is not None:
            self._credits.append(credit_rid)
            self._schedule()
        elif self.releases:
            self._schedule(RIDE_SECONDS)  # an EXECUTE sent meanwhile carries them

    def cancel(self, rid: int) -> None:
        if not self.closed:
            self._cancels.append(rid)
            self._schedule()

    def take_releases(self) -> list[list[int]]:
        """The pending releases, for an EXECUTE frame to carry."""
        releases, self.releases = self.releases, []
        return releases

    def _schedule(self, delay: float = 0.0) -> None:
        if self._flush_handle is not None:
            if delay or not self._flush_delayed:
                return  # a flush as soon as this one, or sooner, is due already
            self._flush_handle.cancel()  # something must go now, not when the timer fires
        self._flush_delayed = bool(delay)
        self._flush_handle = self._loop.call_later(delay, self._flush) if delay else self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        channel = self._channel
        if self.closed or channel.closed:
            self.clear()
            return
        try:
            if self._cancels and not channel.try_send(msg.encode(msg.Cancel(self._cancels))):
                return self._schedule(0.001)
            self._cancels = []
            while self.releases or self._credits:
                # at most _CHUNK entries a frame keeps every frame far below the frame limit
                releases, credits = self.releases[:_CHUNK], self._credits[:_CHUNK]
                if not channel.try_send(msg.encode(msg.Release(releases, credits))):
                    return self._schedule(0.001)  # the stub's queue is full: try again shortly
                del self.releases[:_CHUNK], self._credits[:_CHUNK]
        except ChannelClosedError:
            self.clear()

    def clear(self) -> None:
        self.releases, self._credits, self._cancels = [], [], []
