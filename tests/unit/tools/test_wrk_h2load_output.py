"""tools/compare/wrk_h2load.py: what it makes of wrk's and h2load's output, and when a window counts.

The outputs under loadgen_output/ were recorded from real runs of wrk 4.1.0 (with the bench's Lua
script) and h2load 1.52.0 (with the bench's request and headers) against tools/floor:

    wrk_ok                 8 connections, 1 s, every answer 200
    wrk_404                posted to a model the floor does not serve: every answer 404
    h2load_ok              -n 2000 on 8 streams, every call answered with grpc-status 0
    h2load_unimplemented   -n 500 to a method the floor does not serve: grpc-status 12 in
                           trailers-only answers, which h2load counts as succeeded
    h2load_refused         -n 500 to a closed port
    h2load_timed           -D 500ms: 8 requests still in flight when the time was up
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from harness import ROOT

sys.path.insert(0, str(ROOT / "tools"))  # tools/compare is the bench's, not an installed package

from compare.loadgen import Point  # noqa: E402
from compare.wrk_h2load import (  # noqa: E402
    GRPC_HEADERS,
    INFER_METHOD,
    Outcome,
    _judge,
    grpc_frame,
    grpc_message,
    h2load_command,
    http_body,
    parse_h2load,
    parse_wrk,
    wrk_command,
)
from tritonclient.grpc import service_pb2  # noqa: E402

RECORDED = Path(__file__).with_name("loadgen_output")


def _recorded(name: str) -> str:
    return (RECORDED / f"{name}.txt").read_text()


def test_wrk_summary_line_gives_exact_counts_and_percentiles() -> None:
    outcome = parse_wrk(_recorded("wrk_ok"))
    assert outcome == Outcome(requests=46751, seconds=1.003617, errors=0, p50_ms=0.156, p99_ms=1.755)
    assert outcome.throughput == pytest.approx(46582.5, rel=1e-4)  # wrk's own Requests/sec line


def test_wrk_error_answers_are_errors() -> None:
    outcome = parse_wrk(_recorded("wrk_404"))
    assert outcome.requests == 26974 and outcome.errors == 26974


def test_wrk_output_without_the_summary_line_is_refused() -> None:
    text = _recorded("wrk_ok").replace("wrk-summary", "something else")
    with pytest.raises(ValueError, match="no wrk-summary"):
        parse_wrk(text)


def test_h2load_counted_run() -> None:
    outcome = parse_h2load(_recorded("h2load_ok"))
    assert (outcome.requests, outcome.errors) == (2000, 0)
    assert outcome.seconds == pytest.approx(0.07837)
    assert outcome.throughput == pytest.approx(25520.6, rel=1e-3)  # h2load's own req/s
    assert outcome.p50_ms != outcome.p50_ms  # h2load gives no percentiles: NaN, shown as "–"


def test_h2load_timed_run_counts_what_was_done() -> None:
    outcome = parse_h2load(_recorded("h2load_timed"))
    assert (outcome.requests, outcome.errors) == (15095, 0)
    assert outcome.seconds == pytest.approx(0.50064)


def test_h2load_refused_connection_is_errors() -> None:
    outcome = parse_h2load(_recorded("h2load_refused"))
    assert outcome.requests == 0 and outcome.errors >= 500


def test_h2load_output_without_a_summary_is_refused() -> None:
    with pytest.raises(ValueError, match="no summary"):
        parse_h2load("starting benchmark...\n")


def test_grpc_status_h2load_missed_is_caught_by_the_servers_counts() -> None:
    """h2load saw 500 successes where every call failed with UNIMPLEMENTED: the server counted
    none of them, and the window is refused."""
    outcome = parse_h2load(_recorded("h2load_unimplemented"))
    assert (outcome.requests, outcome.errors) == (500, 0)
    with pytest.raises(RuntimeError, match="not a measurement"):
        _judge(outcome, successes=0, failures=0, point=Point("identity_fp32", 16, 8, "grpc"))


def test_a_window_counts_only_when_the_server_agrees() -> None:
    grpc_point, http_point = Point("identity_fp32", 16, 8, "grpc"), Point("identity_fp32", 16, 8, "http")
    done = Outcome(requests=2000, seconds=1.0, errors=0)
    _judge(done, successes=2000, failures=0, point=grpc_point)
    with pytest.raises(RuntimeError):  # a gRPC window is a count: no failure is anyone else's
        _judge(done, successes=2000, failures=1, point=grpc_point)
    with pytest.raises(RuntimeError):
        _judge(done, successes=1999, failures=0, point=grpc_point)
    # wrk drops at most one request per connection when its time is up; a server may count those failed
    _judge(done, successes=2003, failures=8, point=http_point)
    with pytest.raises(RuntimeError):
        _judge(done, successes=2003, failures=9, point=http_point)
    with pytest.raises(RuntimeError):
        _judge(Outcome(requests=2000, seconds=1.0, errors=1), successes=2000, failures=0, point=http_point)
    with pytest.raises(RuntimeError):  # nothing completed is not a measurement either
        _judge(Outcome(requests=0, seconds=1.0, errors=0), successes=0, failures=0, point=http_point)


def test_requests_are_the_v2_wire_formats(tmp_path: Path) -> None:
    body, header_length = http_body(16)
    header = json.loads(body[:header_length])
    assert header["inputs"][0]["parameters"]["binary_data_size"] == 16 == len(body) - header_length
    assert header["inputs"][0]["shape"] == [1, 4]
    message = grpc_message(16)
    framed = grpc_frame(message)
    assert framed[0] == 0 and int.from_bytes(framed[1:5], "big") == len(message) == len(framed) - 5
    request = service_pb2.ModelInferRequest.FromString(message)
    assert request.model_name == "identity_fp32" and list(request.raw_input_contents) == [body[header_length:]]


def test_command_lines() -> None:
    h2load = h2load_command("127.0.0.1:9", 8, Path("/r.bin"), count=1234)
    assert h2load[h2load.index("-m") + 1] == "8" and h2load[h2load.index("-c") + 1] == "1"
    assert h2load[h2load.index("-n") + 1] == "1234" and "-D" not in h2load
    assert all(header in h2load for header in GRPC_HEADERS) and h2load[-1] == f"http://127.0.0.1:9{INFER_METHOD}"
    assert "1500ms" in h2load_command("127.0.0.1:9", 1, Path("/r.bin"), seconds=1.5)
    wrk = wrk_command("127.0.0.1:9", 8, 0.3, Path("/p.lua"))
    assert wrk[wrk.index("-c") + 1] == "8" and wrk[wrk.index("-d") + 1] == "1s"  # wrk takes whole seconds
