"""Slow and idle clients are closed on time: 1,000 connections that connect and
say nothing, send one header line at a time, or one body byte at a time (each gap shorter than the
timeout, so only a deadline over the whole head or body catches them) are closed when their
deadline passes, health answers meanwhile, and the backend's descriptors return to baseline."""

from __future__ import annotations

import selectors
import socket
import statistics
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest
from harness import Backend, make_repository, module_backend

TIMEOUT = 6.0  # the header, body and gRPC handshake timeouts of the backend under test
GAP = 1.0  # seconds between a slow client's sends: shorter than TIMEOUT
SLACK = 6.0  # how late a close may come on a loaded 2-core machine
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("slow"), "identity_fp32")
    with module_backend(Backend(repository, f"--http-header-timeout-secs={TIMEOUT}",
                                f"--http-body-timeout-secs={TIMEOUT}",
                                f"--grpc-handshake-timeout={int(TIMEOUT * 1000)}")) as server:
        yield server


@dataclass
class Client:
    kind: str
    sock: socket.socket
    opened: float
    sent: int = 0
    closed: float | None = None

    def trickle(self) -> None:
        """Send the next piece: a header line, a body byte, a preface byte, or nothing."""
        pieces = {"head": b"X-Slow: 1\r\n", "body": b"0", "grpc-preface": PREFACE[self.sent:self.sent + 1]}
        piece = pieces.get(self.kind)
        if piece:
            try:
                self.sock.send(piece)
                self.sent += 1
            except OSError:
                pass  # closed under us: the next read says so


def _open(kind: str, address: tuple[str, int]) -> Client:
    sock = socket.create_connection(address, timeout=30)
    if kind == "head":
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: pystub\r\n")
    elif kind == "body":
        sock.sendall(b"POST /v2/repository/index HTTP/1.1\r\nHost: pystub\r\nContent-Length: 1000\r\n\r\n")
    sock.setblocking(False)
    return Client(kind, sock, time.monotonic())


def _drive(clients: list[Client], deadline: float) -> None:
    """Trickle every GAP s; note when the server closes each connection (a read of b'' or a reset)."""
    with selectors.DefaultSelector() as selector:
        for client in clients:
            selector.register(client.sock, selectors.EVENT_READ, client)
        next_send = time.monotonic()
        while selector.get_map() and time.monotonic() < deadline:
            if time.monotonic() >= next_send:
                for key in list(selector.get_map().values()):
                    key.data.trickle()
                next_send += GAP
            for key, _ in selector.select(timeout=0.05):
                client = key.data
                try:
                    if client.sock.recv(4096):
                        continue  # a reply (none is expected before the close)
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                client.closed = time.monotonic()
                selector.unregister(client.sock)


def _probe(url: str, stop: threading.Event, latencies: list[float]) -> None:
    while not stop.is_set():
        start = time.monotonic()
        with urllib.request.urlopen(f"http://{url}/v2/health/live", timeout=10) as response:
            assert response.status == 200
        latencies.append(time.monotonic() - start)
        time.sleep(0.02)


def _held(process: psutil.Process, wanted: int, until: float) -> int:
    """The most descriptors `process` held while waiting, until it holds `wanted` or `until` passes
    (the first connection's deadline): a loaded backend accepts a burst of connections from its
    listen backlog a while after the clients think they are connected."""
    most = process.num_fds()
    while most < wanted and time.monotonic() < until:
        time.sleep(0.05)
        most = max(most, process.num_fds())
    return most


def test_a_thousand_slow_or_idle_connections_are_closed_on_time(backend: Backend):
    process = psutil.Process(backend.pid)
    baseline = process.num_fds()
    http_address = tuple(backend.http_url.rsplit(":", 1))
    grpc_address = tuple(backend.grpc_url.rsplit(":", 1))
    kinds = {"idle": 300, "head": 300, "body": 300, "grpc-idle": 50, "grpc-preface": 50}
    clients: list[Client] = []
    stop, latencies = threading.Event(), []
    prober = threading.Thread(target=_probe, args=(backend.http_url, stop, latencies))
    prober.start()
    try:
        started = time.monotonic()
        for kind, count in kinds.items():
            host, port = grpc_address if kind.startswith("grpc") else http_address
            clients += [_open(kind, (host, int(port))) for _ in range(count)]
        print(f"opened {len(clients)} connections in {time.monotonic() - started:.2f} s")
        peak = _held(process, baseline + 900, until=clients[0].opened + TIMEOUT - 0.5)
        assert peak >= baseline + 900, (baseline, peak)  # the backend holds them all
        _drive(clients, time.monotonic() + TIMEOUT + SLACK + 5)
    finally:
        stop.set()
        prober.join(30)
        for client in clients:
            client.sock.close()
    for kind in kinds:
        ours = [c for c in clients if c.kind == kind]
        still_open = [c for c in ours if c.closed is None]
        assert not still_open, f"{len(still_open)} {kind} connections still open"
        lifetimes = sorted(c.closed - c.opened for c in ours)
        print(f"{kind}: closed after {lifetimes[0]:.2f}..{lifetimes[-1]:.2f} s")
        assert lifetimes[0] >= TIMEOUT - 0.5, kind  # not before the deadline ...
        assert lifetimes[-1] <= TIMEOUT + SLACK, kind  # ... and soon after it
    assert all(c.sent >= 2 for c in clients if c.kind in ("head", "body"))  # they did trickle
    print(f"health during: {len(latencies)} probes, median {statistics.median(latencies) * 1e3:.1f} ms, "
          f"max {max(latencies) * 1e3:.1f} ms")
    assert len(latencies) >= 10
    deadline = time.monotonic() + 10
    while process.num_fds() > baseline and time.monotonic() < deadline:
        time.sleep(0.1)
    assert process.num_fds() <= baseline


def test_a_fast_client_is_not_affected(backend: Backend):
    """Kept-alive requests well within the limits, spread over more than the timeouts, all succeed on one connection."""
    import http.client
    connection = http.client.HTTPConnection(*backend.http_url.rsplit(":", 1), timeout=10)
    try:
        started = time.monotonic()
        while time.monotonic() - started < TIMEOUT * 1.5:
            connection.request("POST", "/v2/repository/index", body=b"{}")
            response = connection.getresponse()
            assert response.status == 200
            response.read()
            time.sleep(0.5)
    finally:
        connection.close()
