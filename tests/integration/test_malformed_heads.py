"""Malformed HTTP request heads (a bare CR, a NUL, a 9 KB header line) are the client's mistake:
each gets a 400, the connection closes, and the log has one access line (at --log-verbose 1) and
no traceback, in both log formats and through the frontend workers."""

from __future__ import annotations

import re
import socket
import time

import pytest
from harness import EXAMPLES, Backend

HEADS = {
    "bare CR": b"GET /v2/health/ready HTTP/1.1\r\nHost: x\rEvil: 1\r\n\r\n",
    "NUL": b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
    "9 KB header": b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9 * 1024 + b"\r\n\r\n",
}


def _send(port: int, head: bytes) -> bytes:
    """Send `head`, read until the server closes; returns what it answered."""
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def _access_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if re.search(r"HTTP \S+ \S+ 400 ", line)]


@pytest.mark.parametrize("flags", [
    (),
    ("--log-verbose=1",),
    ("--log-verbose=1", "--log-format=json"),
    ("--log-verbose=1", "--frontend-workers=2"),
], ids=["verbose-0", "verbose-1", "json", "workers"])
def test_a_malformed_head_is_a_400_with_one_access_line_and_no_traceback(flags: tuple[str, ...]):
    with Backend(EXAMPLES, "--allow-grpc=false", *flags) as server:
        for name, head in HEADS.items():
            before = len(_access_lines(server.log()))
            answer = _send(server.ports["http"], head)
            assert re.match(rb"HTTP/1\.[01] 400 ", answer), (name, answer[:200])
            if "--log-verbose=1" in flags:
                deadline = time.monotonic() + 30
                while len(_access_lines(server.log())) == before:
                    assert time.monotonic() < deadline, f"timed out waiting for the access line of the {name} head"
                    time.sleep(0.05)
        healthy = _send(server.ports["http"], b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert healthy.startswith(b"HTTP/1.1 200 ")
    log = server.log()
    assert "Traceback" not in log and "Error handling request" not in log, log
    assert len(_access_lines(log)) == (len(HEADS) if "--log-verbose=1" in flags else 0), log
