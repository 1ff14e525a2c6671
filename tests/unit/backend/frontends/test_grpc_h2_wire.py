"""The h2 gRPC stack's pure parts: the wire format and the connection policy."""

from __future__ import annotations

import gzip
import zlib

import grpc
import pytest

from pystub_backend.backend.frontends.grpc.h2.policy import ConnectionPolicy, PingJudge
from pystub_backend.backend.frontends.grpc.h2.wire import (
    MessageReader,
    WireError,
    frame_parts,
    inflate_rest,
    inflate_start,
    is_grpc_content_type,
    metadata_headers,
    metadata_of,
    parse_timeout,
    response_encoding,
    status_headers,
)


def _frame(payload: bytes, encoding: str | None = None) -> bytes:
    """One message as the writer puts it on the wire: prefix and body, joined."""
    return b"".join(frame_parts(payload, encoding))


@pytest.mark.parametrize(("text", "seconds"), [(b"1S", 1.0), (b"250m", 0.25), (b"3M", 180.0), (b"2H", 7200.0),
                                               (b"5000u", 0.005), (b"99999999n", 0.099999999),
                                               (b"123456789S", 123456789.0), (b" 2 S ", 2.0)])
def test_grpc_timeout_units(text: bytes, seconds: float) -> None:
    assert parse_timeout(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", [b"", b"S", b"10", b"1x", b"-1S", b"1.5S", b"abc", b"\xd9\xa3S"])
def test_malformed_grpc_timeout_is_none(text: bytes) -> None:
    assert parse_timeout(text) is None


def test_metadata_leaves_out_the_protocol_headers_and_decodes_binary_values() -> None:
    headers = [(b":path", b"/s/M"), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
               (b"grpc-timeout", b"1S"), (b"grpc-accept-encoding", b"gzip"), (b"user-agent", b"grpc-python"),
               (b"x-key", b"value"), (b"trace-bin", b"AAEC"), (b"padded-bin", b"AAE=")]
    assert metadata_of(headers) == (("user-agent", "grpc-python"), ("x-key", "value"), ("trace-bin", b"\x00\x01\x02"),
                                    ("padded-bin", b"\x00\x01"))
    with pytest.raises(WireError):
        metadata_of([(b"bad-bin", b"!!!")])


def test_metadata_headers_encode_binary_values_and_refuse_reserved_keys() -> None:
    assert metadata_headers([("x-a", "b"), ("k-bin", b"\x00\x01")]) == [(b"x-a", b"b"), (b"k-bin", b"AAE")]
    for key in ("Upper", "grpc-status", ":path"):
        with pytest.raises(ValueError):
            metadata_headers([(key, "v")])


def test_status_details_are_percent_encoded() -> None:
    headers = dict(status_headers(grpc.StatusCode.NOT_FOUND, "100% näive\n", [("x-t", "1")]))
    assert headers == {b"grpc-status": b"5", b"grpc-message": b"100%25 n%C3%A4ive%0A", b"x-t": b"1"}
    assert dict(status_headers(grpc.StatusCode.OK, None, ())) == {b"grpc-status": b"0"}


def test_response_encoding_follows_grpc_core_levels() -> None:
    both = b"identity,deflate,gzip"
    assert response_encoding(0, both) is None
    assert [response_encoding(level, both) for level in (1, 2, 3)] == ["deflate", "gzip", "gzip"]
    assert response_encoding(3, b"identity,deflate") == "deflate"
    assert response_encoding(3, b"identity") is None and response_encoding(2, None) is None


def test_reader_cuts_messages_across_chunks() -> None:
    data = _frame(b"first") + _frame(b"") + _frame(b"x" * 1000)
    reader = MessageReader(None, -1)
    messages = [message for start in range(0, len(data), 7) for message in reader.feed(data[start:start + 7])]
    assert messages == [(0, b"first"), (0, b""), (0, b"x" * 1000)] and not reader.partial


def _inflated(wire: bytes, encoding: str, limit: int) -> bytes:
    """A compressed message through the reader and both steps of inflating it."""
    ((flag, payload),) = MessageReader(encoding, limit).feed(wire)
    assert flag == 1
    whole, inflater, first = inflate_start(payload, encoding, limit)
    return whole if whole is not None else inflate_rest(inflater, first, encoding, limit)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize("size", [3000, 5 << 20])  # inflated in one step on the loop, or in several
def test_compressed_messages_are_inflated(encoding: str, size: int) -> None:
    payload = (b"abc" * size)[:size]
    packed = gzip.compress(payload) if encoding == "gzip" else zlib.compress(payload)
    assert _inflated(b"\x01" + len(packed).to_bytes(4, "big") + packed, encoding, -1) == payload
    assert _frame(payload, encoding)[0] == 1  # and the writer compresses what shrinks
    assert _inflated(_frame(payload, encoding), encoding, -1) == payload


def test_a_bomb_stops_at_the_limit_it_inflates_past() -> None:
    """The size is checked after every step, not once the whole message is out: a 64 KiB message
    that would be 64 MiB stops one step past 3 MiB."""
    bomb = zlib.compress(bytes(64 << 20), 9)
    assert len(bomb) < 100 << 10
    wire = b"\x01" + len(bomb).to_bytes(4, "big") + bomb
    with pytest.raises(WireError) as info:
        _inflated(wire, "deflate", 3 << 20)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.details == f"Received message larger than max ({4 << 20} vs. {3 << 20})"


def test_reader_refuses_oversized_and_unannounced_compressed_messages() -> None:
    with pytest.raises(WireError) as info:
        MessageReader(None, 10).feed(_frame(b"x" * 11))
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    bomb = zlib.compress(bytes(1 << 20))
    with pytest.raises(WireError) as info:  # a small compressed message inflating past the limit
        _inflated(b"\x01" + len(bomb).to_bytes(4, "big") + bomb, "deflate", 1000)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(WireError) as info:
        MessageReader(None, -1).feed(b"\x01\x00\x00\x00\x01x")
    assert (info.value.code, info.value.details) == (grpc.StatusCode.INTERNAL,
                                                     "Compression bit set but no encoding configured")


@pytest.mark.parametrize(("value", "grpc_call"), [(b"application/grpc", True), (b"application/grpc+proto", True),
                                                  (b"application/grpc;charset=utf-8", True),
                                                  (b"application/grpcfoo", False), (b"application/grpc-web", False),
                                                  (b"application/json", False), (b"", False)])
def test_content_type_is_checked_exactly(value: bytes, grpc_call: bool) -> None:
    assert is_grpc_content_type(value) is grpc_call


def test_policy_from_channel_arguments() -> None:
    default = ConnectionPolicy.of({})
    assert (default.keepalive_time, default.idle, default.age, default.max_receive) == (7200.0, None, None, 4 << 20)
    policy = ConnectionPolicy.of({"grpc.keepalive_time_ms": 500, "grpc.max_connection_idle_ms": 2**31 - 1,
                                  "grpc.max_connection_age_ms": 200, "grpc.max_receive_message_length": -1,
                                  "grpc.default_compression_level": 3})
    assert (policy.keepalive_time, policy.idle, policy.age, policy.max_receive, policy.compression_level) == \
        (0.5, None, 0.2, -1, 3)


def test_ping_strikes_follow_grpc_core() -> None:
    judge = PingJudge(ConnectionPolicy(min_ping_interval=10.0, max_ping_strikes=2))
    assert not any(judge.too_many(now, calls_open=True) for now in (0.0, 1.0, 2.0))  # two strikes allowed
    assert judge.too_many(3.0, calls_open=True)
    judge.data_sent()  # sending data forgives the strikes
    assert not judge.too_many(3.5, calls_open=True) and not judge.too_many(20.0, calls_open=True)
    idle = PingJudge(ConnectionPolicy(min_ping_interval=10.0, max_ping_strikes=0))
    assert not any(idle.too_many(float(now), calls_open=False) for now in range(10))  # 0: no limit


def test_reader_joins_a_message_from_pieces_and_keeps_what_follows() -> None:
    """A message in DATA-frame pieces, its prefix split across two, the next message starting in the
    piece that ends it: each comes out whole, once."""
    big, small = bytes(range(256)) * 300, b"next"
    data = _frame(big) + _frame(small)
    reader = MessageReader(None, -1)
    pieces = [data[:3], data[3:16384], data[16384:len(data) - 6], data[len(data) - 6:]]
    messages = [message for piece in pieces for message in reader.feed(piece)]
    assert messages == [(0, big), (0, small)] and not reader.partial
