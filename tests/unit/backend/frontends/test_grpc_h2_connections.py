"""The h2 gRPC stack's connection policy on real sockets, seen by an HTTP/2 client written with
ngh2: the ping abuse policy, keepalive pings without an ack, the idle limit, the handshake limit."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import ngh2
from h2_server import RawH2Client, RunningH2Server

from pystub_backend.backend.frontends.grpc.h2 import H2Server

_WAIT = 10.0


def test_too_many_pings_get_goaway(started: list[RunningH2Server]) -> None:
    started.append(RunningH2Server({"grpc.http2.max_ping_strikes": 2}))
    client = RawH2Client(started[0].port)
    try:
        for _ in range(4):  # the default minimum interval is 5 minutes: each ping after the first is a strike
            client.h2.ping()
        client.flush()
        events, _ = client.events_until_closed()
    finally:
        client.close()
    goaway = [event for event in events if isinstance(event, ngh2.GoAwayReceived)]
    assert goaway and goaway[0].error_code == ngh2.ErrorCode.ENHANCE_YOUR_CALM
    assert goaway[0].debug_data == b"too_many_pings"


def test_pings_within_the_policy_are_answered(started: list[RunningH2Server]) -> None:
    started.append(RunningH2Server({"grpc.http2.max_ping_strikes": 0, "grpc.max_connection_idle_ms": 1000}))
    client = RawH2Client(started[0].port)
    try:
        for _ in range(5):  # 0 strikes: no limit
            client.h2.ping()
        client.flush()
        events, _ = client.events_until_closed()  # the idle limit ends it
    finally:
        client.close()
    assert sum(isinstance(event, ngh2.PingAcknowledged) for event in events) == 5
    assert not any(isinstance(event, ngh2.GoAwayReceived) and event.error_code for event in events)


def test_idle_connection_gets_goaway_and_closes(started: list[RunningH2Server]) -> None:
    started.append(RunningH2Server({"grpc.max_connection_idle_ms": 300}))
    opened = time.monotonic()
    client = RawH2Client(started[0].port)
    try:
        events, closed = client.events_until_closed()
    finally:
        client.close()
    assert closed - opened >= 0.3
    assert any(isinstance(event, ngh2.GoAwayReceived) and event.error_code == 0 for event in events)


def test_keepalive_ping_without_ack_closes_the_connection(started: list[RunningH2Server]) -> None:
    started.append(RunningH2Server({"grpc.keepalive_time_ms": 200, "grpc.keepalive_timeout_ms": 300}))
    opened = time.monotonic()
    client = RawH2Client(started[0].port)
    try:
        _, closed = client.events_until_closed(answer=False)  # the server's ping is never acknowledged
    finally:
        client.close()
    assert closed - opened >= 0.5  # the ping after 0.2 s, then 0.3 s for its ack


def test_keepalive_ping_with_ack_keeps_the_connection(started: list[RunningH2Server]) -> None:
    started.append(RunningH2Server({"grpc.keepalive_time_ms": 100, "grpc.keepalive_timeout_ms": 300,
                             "grpc.max_connection_idle_ms": 1000}))
    client = RawH2Client(started[0].port)
    try:
        events, _ = client.events_until_closed()  # acknowledged pings; the idle limit ends it
    finally:
        client.close()
    assert sum(isinstance(event, ngh2.PingReceived) for event in events) >= 3
    assert any(isinstance(event, ngh2.GoAwayReceived) for event in events)  # closed by idleness, not keepalive


def test_a_connection_without_the_preface_is_closed_at_the_handshake_limit(started: list[RunningH2Server]) -> None:
    started.append(RunningH2Server({"grpc.server_handshake_timeout_ms": 300}))
    opened = time.monotonic()
    client = RawH2Client(started[0].port, preface=False)
    try:
        _, closed = client.events_until_closed(answer=False)
    finally:
        client.close()
    assert closed - opened >= 0.3


def test_accepted_tcp_connections_do_not_wait_for_acks_to_send(started: list[RunningH2Server]) -> None:
    """TCP_NODELAY on every accepted connection: with Nagle's algorithm an answer's last small
    frames waited for the client's delayed ACK (40 ms)."""
    started.append(running := RunningH2Server({}))
    client = RawH2Client(running.port)
    try:
        async def accepted() -> list[int]:
            deadline = time.monotonic() + _WAIT
            while not running.server._state.connections:
                assert time.monotonic() < deadline, "timed out waiting for the server to accept the connection"
                await asyncio.sleep(0.01)
            return [connection._transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                    for connection in running.server._state.connections]

        assert running.run(accepted()) == [1]
    finally:
        client.sock.close()


def test_settings_let_clients_send_mebibyte_frames(started: list[RunningH2Server]) -> None:
    """SETTINGS_MAX_FRAME_SIZE is 1 MiB: a 16 MiB message arrives in 16 DATA frames, each an event
    handled in Python, instead of 1,024 of the protocol's default 16 KiB (the calls' own tests send
    such messages through grpcio, which frames by this setting)."""
    started.append(running := RunningH2Server({}))
    client = RawH2Client(running.port)
    try:
        deadline = time.monotonic() + _WAIT
        while not any(isinstance(event, ngh2.SettingsReceived) for event in client.h2.events()):
            assert time.monotonic() < deadline, "timed out waiting for the server's SETTINGS"
            client.h2.receive_data(client.sock.recv(65536))
        settings = client.h2.remote_settings
    finally:
        client.close()
    assert settings[ngh2.Setting.MAX_FRAME_SIZE] == 1 << 20


def test_a_unix_socket_accepts_one_connection_after_another(tmp_path: Path) -> None:
    """The accept loop (h2/accept.py) stops when no client waits: the listening socket is made
    non-blocking for it (a blocking one held the event loop at the second accept)."""
    import grpc

    async def echo(request: bytes, context: object) -> bytes:
        return request

    async def run() -> list[bytes]:
        server = H2Server({})
        server.add_registered_method_handlers("t.E", {"Echo": grpc.unary_unary_rpc_method_handler(echo)})
        server.add_insecure_port(f"unix:{tmp_path / 'grpc.sock'}")
        await server.start()
        try:
            answers = []
            for text in (b"one", b"two"):
                async with grpc.aio.insecure_channel(f"unix:{tmp_path / 'grpc.sock'}") as channel:
                    answers.append(await channel.unary_unary("/t.E/Echo")(text, timeout=_WAIT))
            return answers
        finally:
            await server.stop(None)

    assert asyncio.run(asyncio.wait_for(run(), 3 * _WAIT)) == [b"one", b"two"]
