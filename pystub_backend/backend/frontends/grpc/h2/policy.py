"""The connection policy of the h2 stack, from the same grpc core channel arguments as grpc.aio's
(`listener.channel_arguments`), with grpc core's defaults where a flag leaves one unset.

    keepalive        grpc.keepalive_time_ms (the server pings an idle... any connection that often),
                     grpc.keepalive_timeout_ms (no ack by then: the connection is closed)
    ping abuse       a client ping sooner than grpc.http2.min_ping_interval_without_data_ms after
                     the last (2 h while no call is open, unless grpc.keepalive_permit_without_calls)
                     is a strike; more than grpc.http2.max_ping_strikes strikes: GOAWAY
                     ENHANCE_YOUR_CALM "too_many_pings". Sending headers, DATA frames or
                     window updates clears the strikes (a client reading a long answer pings
                     as it reads: grpc's BDP probes).
    limits           grpc.max_connection_idle_ms (no call for that long: GOAWAY),
                     grpc.max_connection_age_ms (GOAWAY) then grpc.max_connection_age_grace_ms (closed),
                     grpc.server_handshake_timeout_ms (TLS and the HTTP/2 preface must be done by then),
                     grpc.max_receive_message_length / grpc.max_send_message_length (-1: none),
                     grpc.absolute_max_metadata_size (a call's header list, 16 KiB by default: over
                     it that call alone ends RESOURCE_EXHAUSTED, as in grpc core)
    pystub's own     pystub.request_read_timeout_ms (a call's first message must arrive by then),
                     pystub.max_connection_memory (the bytes of requests one connection's calls
                     may hold; see inbound.py)
    floods           frames that make the server work and carry nothing (a stream the client resets
                     before its answer, DATA for a stream that is gone, a WINDOW_UPDATE that no data
                     sent calls for, SETTINGS after the first) are counted in a token bucket of `FLOOD_BURST`
                     refilled at `FLOOD_RATE` a second; a client that empties it gets GOAWAY
                     ENHANCE_YOUR_CALM and is closed (HTTP/2 Rapid Reset among them)
    compression      grpc.default_compression_level (0..3) for the responses
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ConnectionPolicy", "PingJudge", "FloodJudge", "MAX_METADATA", "REQUEST_READ_TIMEOUT_MS",
           "MAX_CONNECTION_MEMORY", "FLOOD_BURST", "FLOOD_RATE"]

_HOUR_MS = 3_600_000
MAX_METADATA = 16 << 10  # grpc core's default hard limit on a call's header list
REQUEST_READ_TIMEOUT_MS = 60_000  # as the HTTP frontend's --http-body-timeout-secs
MAX_CONNECTION_MEMORY = 1 << 30
# A client may send this many work-less frames at once, and this many a second after that. A
# client that cancels calls or reads answers sends some; a flood sends 100,000s a second.
FLOOD_BURST = 2000
FLOOD_RATE = 500.0


def _seconds(milliseconds: int | None) -> float | None:
    """A duration in seconds; None for grpc's "infinite" (unset, or INT_MAX)."""
    if milliseconds is None or milliseconds <= 0 or milliseconds >= 2**31 - 1:
        return None
    return milliseconds / 1000


@dataclass(frozen=True)
class ConnectionPolicy:
    keepalive_time: float | None = 2 * _HOUR_MS / 1000
    keepalive_timeout: float = 20.0
    min_ping_interval: float = 300.0
    max_ping_strikes: int = 2
    permit_without_calls: bool = False
    idle: float | None = None
    age: float | None = None
    age_grace: float | None = None
    handshake_timeout: float | None = 120.0
    max_receive: int = 4 << 20
    max_send: int = -1
    compression_level: int = 0
    max_metadata: int = MAX_METADATA
    request_read_timeout: float | None = REQUEST_READ_TIMEOUT_MS / 1000
    max_connection_memory: int = MAX_CONNECTION_MEMORY

    @classmethod
    def of(cls, args: dict[str, int]) -> ConnectionPolicy:
        """The policy of grpc core channel arguments (unknown ones are grpc.aio's alone: ignored)."""
        def get(name: str, default: int) -> int:
            return int(args.get(name, default))

        return cls(
            keepalive_time=_seconds(get("grpc.keepalive_time_ms", 2 * _HOUR_MS)),
            keepalive_timeout=get("grpc.keepalive_timeout_ms", 20_000) / 1000,
            min_ping_interval=get("grpc.http2.min_ping_interval_without_data_ms", 300_000) / 1000,
            max_ping_strikes=get("grpc.http2.max_ping_strikes", 2),
            permit_without_calls=bool(get("grpc.keepalive_permit_without_calls", 0)),
            idle=_seconds(args.get("grpc.max_connection_idle_ms")),
            age=_seconds(args.get("grpc.max_connection_age_ms")),
            age_grace=_seconds(args.get("grpc.max_connection_age_grace_ms")),
            handshake_timeout=_seconds(get("grpc.server_handshake_timeout_ms", 120_000)),
            max_receive=get("grpc.max_receive_message_length", 4 << 20),
            max_send=get("grpc.max_send_message_length", -1),
            compression_level=get("grpc.default_compression_level", 0),
            max_metadata=get("grpc.absolute_max_metadata_size", MAX_METADATA),
            request_read_timeout=_seconds(get("pystub.request_read_timeout_ms", REQUEST_READ_TIMEOUT_MS)),
            max_connection_memory=get("pystub.max_connection_memory", MAX_CONNECTION_MEMORY) or -1,  # 0: none
        )


class PingJudge:
    """grpc core's ping abuse policy for the pings one client sends."""

    def __init__(self, policy: ConnectionPolicy) -> None:
        self._policy = policy
        self._last: float | None = None
        self._strikes = 0

    def data_sent(self) -> None:
        """The server sent headers or data (not a ping's ack): the strikes start again, as in grpc core."""
        self._strikes = 0
        self._last = None

    def too_many(self, now: float, calls_open: bool) -> bool:
        """A ping came at `now`: whether the client has now pinged too often (GOAWAY)."""
        policy = self._policy
        interval = policy.min_ping_interval if calls_open or policy.permit_without_calls else 2 * _HOUR_MS / 1000
        last, self._last = self._last, now
        if last is not None and now - last < interval:
            self._strikes += 1
        return policy.max_ping_strikes > 0 and self._strikes > policy.max_ping_strikes


class FloodJudge:
    """Counts the frames of one client that carry nothing (the module docstring's "floods")."""

    __slots__ = ("_tokens", "_last")

    def __init__(self, now: float) -> None:
        self._tokens = float(FLOOD_BURST)
        self._last = now

    def flooding(self, now: float, frames: int) -> bool:
        """`frames` more such frames came by `now`: whether the bucket is empty (GOAWAY)."""
        self._tokens = min(float(FLOOD_BURST), self._tokens + (now - self._last) * FLOOD_RATE) - frames
        self._last = now
        return self._tokens < 0
