"""Network helpers the integration tests share: a JSON HTTP call that returns the error body too,
this machine's non-loopback address (a real peer from outside loopback, for access checks), and
the wait for a server process's readiness."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

import psutil


def non_loopback_ipv4() -> str | None:
    """A non-loopback IPv4 address of this machine, None when it has none."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return str(address.address)
    return None


def http_json(url: str, method: str, path: str, body: bytes | None = None,
              headers: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, Any]:
    """(status, decoded JSON body or None) of `method` `url + path`; an HTTP error is an answer too."""
    call = urllib.request.Request(f"{url}{path}", data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(call, timeout=timeout) as response:
            status, payload = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, payload = error.code, error.read()
    return status, json.loads(payload) if payload else None


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports free a moment ago (for servers that cannot report theirs)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def wait_http_ready(process: subprocess.Popen, http_port: int, name: str, timeout: float) -> None:
    """Wait until the server `process` answers GET /v2/health/ready on `http_port`; an
    AssertionError naming `name` when it exits first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"{name} exited with {process.returncode}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise AssertionError(f"{name}: readiness on its HTTP port not answered within {timeout:.0f} s")
