"""Probe: the gRPC port under attack, on either stack, with a health checker beside it.

For each probe, each tree and each stack (`--grpc-server=h2|aio`) a fresh backend is started on
loopback ephemeral ports (the `identity_fp32` test model), the probe runs for a few seconds from this
process, and a second process sends a gRPC health `Check` every 10 ms on its own connection. Printed
per probe: health p50/p99/max (ms, a check that times out counts as its 5 s limit), the backend's
peak RSS (MiB, sampled every 20 ms), the log lines it wrote per offending connection, and what the
probe saw (statuses, GOAWAY, when the server closed). Every probe is bounded in count and time and
stops by itself; the backend is stopped after each.

    python tools/probe_grpc_attacks.py [--trees before=/tmp/base,after=.] [--stacks h2,aio]
                                       [--probes junk,bomb,...] [--json out.json]

A tree is a checkout whose `pystub_backend` the backend runs (PYTHONPATH), with this tree's venv.
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]
import grpc  # noqa: E402
import ngh2  # noqa: E402
import psutil  # noqa: E402
from h2_server import (  # noqa: E402
    CONTINUATION,
    DATA,
    END_HEADERS,
    HEADERS,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
    grpc_request_block,
    hpack_indexed,
    hpack_literal,
)
from harness import make_repository  # noqa: E402

__all__ = ["main"]

_PORT_LINE = re.compile(r"Started (HTTPService|GRPCInferenceService) at [\d.]+:(\d+)")
_INFER = b"/inference.GRPCInferenceService/ModelInfer"
_HEALTH_LIMIT = 5.0
_RSS_CAP = 8 << 30  # a backend past this is killed (the probe then reads "> 8192")


# -- the backend ---------------------------------------------------------------------------------------
class Server:
    def __init__(self, tree: Path, repository: Path, stack: str, flags: list[str]) -> None:
        self.log_path = Path(tempfile.mkstemp(prefix="probe-grpc-", suffix=".log")[1])
        command = [sys.executable, "-m", "pystub_backend.backend", "--model-repository", str(repository),
                   "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", f"--grpc-server={stack}", *flags]
        env = dict(os.environ, PYTHONPATH=str(tree))
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            cwd=tree, env=env, start_new_session=True)
        deadline = time.monotonic() + 120
        while True:
            found = {m.group(1): int(m.group(2)) for m in _PORT_LINE.finditer(self.log())}
            if len(found) == 2:
                self.port = found["GRPCInferenceService"]
                break
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the backend did not start:\n{self.log()[-2000:]}")
            time.sleep(0.1)
        time.sleep(0.5)  # its start-up lines are written
        self.log_mark = len(self.log().splitlines())
        self.ps = psutil.Process(self.process.pid)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def new_lines(self) -> list[str]:
        return self.log().splitlines()[self.log_mark:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(10)
        self.log_path.unlink(missing_ok=True)


class Sampler(threading.Thread):
    """The backend's peak RSS; kills it past `_RSS_CAP`."""

    def __init__(self, server: Server) -> None:
        super().__init__(daemon=True)
        self.server, self.peak, self.stopped, self.capped = server, 0, threading.Event(), False

    def run(self) -> None:
        while not self.stopped.wait(0.02):
            try:
                rss = self.server.ps.memory_info().rss
            except psutil.Error:
                return
            self.peak = max(self.peak, rss)
            if rss > _RSS_CAP:
                self.capped = True
                self.server.process.kill()
                return


def _health(port: int, stop: multiprocessing.synchronize.Event, out: multiprocessing.queues.Queue) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    latencies = []
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        stub.Check(health_pb2.HealthCheckRequest(), timeout=30)
        out.put("ready")
        while not stop.is_set():
            started = time.monotonic()
            try:
                stub.Check(health_pb2.HealthCheckRequest(), timeout=_HEALTH_LIMIT)
                latencies.append(time.monotonic() - started)
            except grpc.RpcError:
                latencies.append(_HEALTH_LIMIT)
            time.sleep(0.01)
    out.put(latencies)


# -- raw clients ------------------------------------------------------------------------------------
def raw_connection(port: int, settings: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(PREFACE + frame(SETTINGS, 0, 0, settings))
    return sock


def read_frames(sock: socket.socket, seconds: float) -> tuple[list[tuple[int, int, int]], bool]:
    """The (type, flags, stream) of the frames the server sends within `seconds`, and whether it closed."""
    frames, buffer, deadline = [], b"", time.monotonic() + seconds
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            data = sock.recv(1 << 16)
        except TimeoutError:
            continue
        except OSError:
            return frames, True
        if not data:
            return frames, True
        buffer += data
        while len(buffer) >= 9:
            length = int.from_bytes(buffer[:3], "big")
            if len(buffer) < 9 + length:
                break
            frames.append((buffer[3], buffer[4], int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF))
            buffer = buffer[9 + length:]
    return frames, False


class Client:
    """An ngh2 client connection (for calls whose answers are read)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.h2 = ngh2.Connection(ngh2.Role.CLIENT)
        self.h2.initiate_connection({ngh2.Setting.INITIAL_WINDOW_SIZE: 16 << 20})
        self.h2.set_local_window_size(64 << 20)
        self.open = 0  # calls sent
        self.flush()

    def flush(self) -> None:
        self.sock.sendall(self.h2.data_to_send())

    def call(self, body: bytes, extra: Sequence[tuple[bytes, bytes]] = (), end: bool = True) -> int:
        self.open += 1
        stream = self.h2.send_request([(b":method", b"POST"), (b":scheme", b"http"), (b":path", _INFER),
                                       (b":authority", b"x"), (b"content-type", b"application/grpc"),
                                       (b"te", b"trailers"), *extra], end_stream=False)
        if body or end:
            self.h2.send_data(stream, body, end_stream=end)
        self.flush()
        return stream

    def settle(self, seconds: float = 0.3) -> None:
        """Read the server's SETTINGS and WINDOW_UPDATE (its windows are larger than the default)."""
        self.sock.settimeout(seconds)
        try:
            self.h2.receive_data(self.sock.recv(1 << 16))
            self.h2.events()
        except (TimeoutError, OSError):
            pass

    def outcome(self, seconds: float) -> dict[int, str]:
        """grpc-status (and message) per stream, or how it ended, within `seconds` (or once all ended)."""
        ends: dict[int, str] = {}
        deadline = time.monotonic() + seconds
        self.sock.settimeout(0.2)
        while time.monotonic() < deadline and len([key for key in ends if key]) < self.open:
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            except OSError:
                ends[0] = "connection reset"
                break
            if not data:
                ends[0] = "connection closed"
                break
            self.h2.receive_data(data)
            for event in self.h2.events():
                if isinstance(event, (ngh2.ResponseReceived, ngh2.TrailersReceived)):
                    fields = dict(event.headers)
                    if b"grpc-status" in fields:
                        ends[event.stream_id] = (fields[b"grpc-status"] + b" " + fields.get(b"grpc-message", b"")
                                                 ).decode(errors="replace")[:160]
                elif isinstance(event, ngh2.StreamReset):
                    ends.setdefault(event.stream_id, f"RST {event.error_code}")
                elif isinstance(event, ngh2.GoAwayReceived):
                    ends[0] = f"GOAWAY {event.error_code} {event.debug_data.decode(errors='replace')}"
            try:
                self.flush()
            except OSError:
                break
        return ends

    def close(self) -> None:
        self.sock.close()


def _grpc_message(body: bytes, compressed: bool = False) -> bytes:
    return (b"\x01" if compressed else b"\x00") + len(body).to_bytes(4, "big") + body


# -- the probes ---------------------------------------------------------------------------------------
@dataclass
class Result:
    seen: str = ""
    offenders: int = 1  # connections that misbehaved (for log lines per connection)


_PACKED: dict[str, bytes] = {}  # gzip payloads, made before any backend starts (compressing costs CPU)


def packed(name: str) -> bytes:
    if name not in _PACKED:
        _PACKED[name] = gzip.compress(_JUNK if name == "junk" else bytes(1 << 30), 6 if name == "junk" else 9)
    return _PACKED[name]


_JUNK = b"\x78\x00" * (8 << 20)  # 16 MiB of field 15, each an empty varint


def _one_infer(port: int, body: bytes, gzip_it: bool, wait: float = 60.0) -> str:
    client = Client(port)
    try:
        if gzip_it:
            client.call(_grpc_message(packed("junk"), True), [(b"grpc-encoding", b"gzip")])
        else:
            client.call(_grpc_message(body))
        started = time.monotonic()
        ends = client.outcome(wait)
        statuses = [v for k, v in ends.items() if k]
        return f"{statuses[0] if statuses else ends or 'no answer'} after {time.monotonic() - started:.1f} s"
    finally:
        client.close()


def probe_junk(port: int) -> Result:
    return Result(_one_infer(port, _JUNK, False))


def probe_junk_gzip(port: int) -> Result:
    return Result(_one_infer(port, _JUNK, True))


def probe_zeros(port: int) -> Result:
    return Result(_one_infer(port, bytes(4 << 20), False))


def probe_bomb(port: int) -> Result:
    bomb = packed("bomb")  # 1 GiB of zeros, ~1 MiB on the wire
    client = Client(port)
    try:
        client.call(_grpc_message(bomb, True), [(b"grpc-encoding", b"gzip")])
        ends = client.outcome(30)
        return Result(f"{len(bomb) >> 10} KiB gzip: {[v for k, v in ends.items() if k] or ends}")
    finally:
        client.close()


def probe_headers(port: int) -> Result:
    """8 connections x 1000 calls whose header block references one 4 KiB HPACK entry 15 times."""
    socks = []
    pad = b"v" * 4000
    rest = [hpack_indexed(62)] * 15
    for _ in range(8):
        sock = raw_connection(port)
        frames = []
        for index in range(1000):
            first = index == 0
            block = grpc_request_block(_INFER) + (hpack_literal(b"x-pad", pad, indexed=True) if first else b"") + \
                b"".join(rest[1:] if first else rest)
            frames.append(frame(HEADERS, END_HEADERS, 2 * index + 1, block))
        sock.sendall(b"".join(frames))
        socks.append(sock)
    answered = 0
    for sock in socks:
        got, _ = read_frames(sock, 5.0 / len(socks) + 0.2)
        answered += sum(1 for kind, flags, _ in got if kind == HEADERS and flags & 1 or kind == 3)
    time.sleep(3)
    for sock in socks:
        sock.close()
    return Result(f"{answered} of 8000 calls ended within 5 s", offenders=8)


def probe_log_flood(port: int) -> Result:
    """500 connections: a bad client magic, junk, 1,100 header fields, nine CONTINUATION frames."""
    many = grpc_request_block(_INFER, [(b"x-%d" % i, b"v") for i in range(1100)])
    openers = [
        lambda s: s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(64)),
        lambda s: s.sendall(PREFACE + bytes(range(256)) * 4),
        lambda s: s.sendall(PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 1, many)),
        lambda s: s.sendall(PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, 0, 1, grpc_request_block(_INFER)) +
                            b"".join(frame(CONTINUATION, 0, 1, hpack_literal(b"x-c", b"v")) for _ in range(9))),
    ]
    for _ in range(10):  # 50 at a time: opened, sent, then closed once the server had a moment
        socks = []
        for index in range(50):
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                openers[index % 4](sock)
                socks.append(sock)
            except OSError:
                pass
        time.sleep(0.3)
        for sock in socks:
            sock.close()
    time.sleep(1)
    return Result("500 connections", offenders=500)


def probe_descriptors(port: int, server: Server) -> Result:
    """The descriptor table full: the backend's limit set 40 above what it has open, 200 connections."""
    used = len(os.listdir(f"/proc/{server.process.pid}/fd"))
    resource.prlimit(server.process.pid, resource.RLIMIT_NOFILE, (used + 40, used + 40))
    server.ps.cpu_percent()
    socks = []
    for _ in range(200):
        try:
            socks.append(raw_connection(port))
        except OSError:
            break
    time.sleep(5)
    cpu = server.ps.cpu_percent()
    for sock in socks:
        sock.close()
    time.sleep(1)
    return Result(f"{len(socks)} connections held 5 s: backend CPU {cpu:.0f} %", offenders=max(1, len(socks) - 40))


def _flood(port: int, make: Callable[[int], bytes], seconds: float = 5.0,
           setup: Callable[[Client], None] | None = None) -> Result:
    """`make(i)`'s frames sent as fast as the socket takes them for `seconds` (or until closed)."""
    client = Client(port)
    if setup is not None:
        setup(client)
    sock, sent, closed_after = client.sock, 0, None
    started = time.monotonic()
    sock.setblocking(False)
    batch = b"".join(make(index) for index in range(200))
    while time.monotonic() - started < seconds:
        try:
            sock.send(batch)
            sent += 200
        except BlockingIOError:
            time.sleep(0.001)
        except OSError:
            closed_after = time.monotonic() - started
            break
        try:
            if sock.recv(1 << 16) == b"":
                closed_after = time.monotonic() - started
                break
        except BlockingIOError:
            pass
        except OSError:
            closed_after = time.monotonic() - started
            break
    sock.close()
    ended = f"closed after {closed_after:.2f} s" if closed_after is not None else f"open after {seconds:g} s"
    return Result(f"~{sent:,} frames sent, {ended}")


def probe_rapid_reset(port: int) -> Result:
    """HEADERS+RST_STREAM pairs on fresh streams, as fast as the socket takes them, for 5 s."""
    block, streams = grpc_request_block(_INFER), iter(range(1, 1 << 30, 2))

    def pair(_: int) -> bytes:
        stream = next(streams)
        return frame(HEADERS, END_HEADERS, stream, block) + frame(RST_STREAM, 0, stream, (8).to_bytes(4, "big"))
    return _flood(port, pair)


def probe_window_updates(port: int) -> Result:
    return _flood(port, lambda i: frame(WINDOW_UPDATE, 0, 0, (1).to_bytes(4, "big")))


def probe_data_on_closed(port: int) -> Result:
    """DATA frames of one byte on stream 1 once its call has ended, for 5 s."""
    def setup(client: Client) -> None:
        client.call(_grpc_message(b""))
        client.outcome(1.0)
    return _flood(port, lambda i: frame(DATA, 0, 1, b"x"), setup=setup)


def probe_pings(port: int) -> Result:
    """A ping sent as soon as the last one's ack came, with a call open, for up to 8 s."""
    client = Client(port)
    try:
        client.call(b"", end=False)  # open: waits for its message
        client.sock.settimeout(0.5)
        pings, started = 0, time.monotonic()
        while time.monotonic() - started < 8:
            client.h2.ping()
            client.flush()
            pings += 1
            acked = False
            while not acked and time.monotonic() - started < 8:
                try:
                    data = client.sock.recv(1 << 16)
                except TimeoutError:
                    continue
                except OSError:
                    return Result(f"closed after {pings} pings, {time.monotonic() - started:.1f} s")
                if not data:
                    return Result(f"closed after {pings} pings, {time.monotonic() - started:.1f} s")
                client.h2.receive_data(data)
                for event in client.h2.events():
                    if isinstance(event, ngh2.GoAwayReceived):
                        return Result(f"GOAWAY {event.debug_data.decode()} after {pings} pings, "
                                      f"{time.monotonic() - started:.1f} s")
                    acked = acked or isinstance(event, ngh2.PingAcknowledged)
        return Result(f"{pings} pings in 8 s, no GOAWAY")
    finally:
        client.close()


def probe_no_message(port: int) -> Result:
    client = Client(port)
    try:
        for _ in range(10):
            client.call(b"", end=False)
        started = time.monotonic()
        ends = client.outcome(12)
        statuses = sorted({v for k, v in ends.items() if k})
        return Result(f"{len([k for k in ends if k])} of 10 ended within {time.monotonic() - started:.0f} s "
                      f"{statuses[:1]}")
    finally:
        client.close()


def probe_bad_timeouts(port: int) -> Result:
    client = Client(port)
    try:
        streams = {client.call(_grpc_message(b""), [(b"grpc-timeout", value)]): value for value in (b"-1S", b"1.5S",
                                                                                                    b"abc")}
        ends = client.outcome(5)
        return Result("; ".join(f"{streams[k].decode()}: {v}" for k, v in sorted(ends.items()) if k in streams))
    finally:
        client.close()


def probe_unread(port: int, server: Server) -> Result:
    """12 calls of 1 MiB answers never read (more than the sockets' buffers take), with
    --grpc-max-connection-idle=2000: when the server drops the connection (or not within 15 s), and
    its RSS then."""
    client = Client(port)
    client.settle()
    request = _identity_request(1 << 18)
    for _ in range(12):
        client.call(_grpc_message(request))
    started, closed = time.monotonic(), None
    while time.monotonic() - started < 15:
        try:
            conns = [c for c in server.ps.net_connections() if c.status == "ESTABLISHED"]
        except psutil.Error:
            break
        if not any(c.raddr and c.raddr.port == client.sock.getsockname()[1] for c in conns):
            closed = time.monotonic() - started
            break
        time.sleep(0.2)
    rss = server.ps.memory_info().rss >> 20
    client.close()
    seen = f"dropped after {closed:.1f} s" if closed is not None else "still open after 15 s"
    return Result(f"{seen}, RSS then {rss} MiB")


def probe_small(port: int) -> Result:
    """content-type application/grpcfoo and application/grpc-web, a unary call of two messages."""
    client = Client(port)
    try:
        body = _grpc_message(_identity_request(4))
        streams = {}
        for kind in (b"application/grpcfoo", b"application/grpc-web"):
            stream = client.h2.send_request([(b":method", b"POST"), (b":scheme", b"http"), (b":path", _INFER),
                                             (b":authority", b"x"), (b"content-type", kind)], end_stream=False)
            client.h2.send_data(stream, body, end_stream=True)
            streams[stream] = kind.decode()
            client.open += 1
        streams[client.call(body + body)] = "two messages"
        ends = client.outcome(5)
        return Result("; ".join(f"{streams[k]}: {v}" for k, v in sorted(ends.items()) if k in streams))
    finally:
        client.close()


def _identity_request(count: int) -> bytes:
    from tritonclient.grpc import service_pb2
    message = service_pb2.ModelInferRequest(model_name="identity_fp32")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, count])
    message.raw_input_contents.append(bytes(4 * count))
    return message.SerializeToString()


PROBES: dict[str, Callable[..., Result]] = {
    "junk-16M": probe_junk, "junk-16M-gzip": probe_junk_gzip, "zeros-4M": probe_zeros, "bomb-1G": probe_bomb,
    "headers-8x1000": probe_headers, "log-flood-500": probe_log_flood, "descriptors": probe_descriptors,
    "rapid-reset": probe_rapid_reset, "window-update+1": probe_window_updates, "data-on-closed": probe_data_on_closed,
    "paced-pings": probe_pings, "no-message": probe_no_message, "bad-grpc-timeout": probe_bad_timeouts,
    "unread-idle": probe_unread, "small": probe_small,
}
_NEEDS_SERVER = {"descriptors", "unread-idle"}
# The flags a probe's backend is started with (those the tree knows).
_FLAGS = {"no-message": ["--grpc-request-read-timeout=3000"], "unread-idle": ["--grpc-max-connection-idle=2000"]}


# -- running ----------------------------------------------------------------------------------------
def run_one(tree: Path, repository: Path, stack: str, name: str, supported: set[str]) -> dict[str, object]:
    probe = PROBES[name]
    flags = [flag for flag in _FLAGS.get(name, []) if flag.split("=")[0] in supported]  # where the tree has them
    server = Server(tree, repository, stack, flags)
    sampler = Sampler(server)
    stop, out = multiprocessing.Event(), multiprocessing.Queue()
    checker = multiprocessing.Process(target=_health, args=(server.port, stop, out), daemon=True)
    try:
        checker.start()
        assert out.get(timeout=60) == "ready"
        sampler.start()
        time.sleep(0.5)
        result = probe(server.port, server) if name in _NEEDS_SERVER else probe(server.port)
        time.sleep(0.5)
        stop.set()
        latencies = out.get(timeout=60)
    finally:
        stop.set()
        sampler.stopped.set()
        checker.join(10)
        if checker.is_alive():
            checker.kill()
        lines = server.new_lines()
        server.stop()
    ms = sorted(1000 * latency for latency in latencies) or [float("nan")]
    quantile = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else ms * 99
    return {"probe": name, "stack": stack, "flags": flags, "health_p50": statistics.median(ms),
            "health_p99": quantile[98], "health_max": ms[-1], "checks": len(ms),
            "peak_rss_mib": (sampler.peak >> 20) if not sampler.capped else f"> {_RSS_CAP >> 20}",
            "log_lines": len(lines), "lines_per_connection": round(len(lines) / result.offenders, 2),
            "seen": result.seen, "sample_lines": lines[:3]}


def _supported_flags(tree: Path) -> set[str]:
    text = subprocess.run([sys.executable, "-m", "pystub_backend.backend", "--help"], capture_output=True, text=True,
                          cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)), timeout=120).stdout
    return set(re.findall(r"--[a-z0-9-]+", text))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", default=f"this={ROOT}", help="name=path,... (default: this tree)")
    parser.add_argument("--stacks", default="h2,aio")
    parser.add_argument("--probes", default=",".join(PROBES))
    parser.add_argument("--json", default="")
    options = parser.parse_args(argv)
    trees = [(name, Path(path).resolve()) for name, path in (item.split("=", 1) for item in options.trees.split(","))]
    work = Path(tempfile.mkdtemp(prefix="probe-grpc-"))
    results = []
    try:
        repository = make_repository(work, "identity_fp32")
        supported = {name: _supported_flags(path) for name, path in trees}
        packed("junk"), packed("bomb")
        print(f"load average at start: {os.getloadavg()}", flush=True)
        for probe in options.probes.split(","):
            for stack in options.stacks.split(","):
                for name, path in trees:
                    row = run_one(path, repository, stack, probe, supported[name])
                    row["tree"] = name
                    row["load"] = round(os.getloadavg()[0], 1)
                    results.append(row)
                    print(f"{probe:16} {stack:3} {name:7} health p50 {row['health_p50']:7.1f} p99 "
                          f"{row['health_p99']:7.1f} max {row['health_max']:7.1f} ms  "
                          f"RSS {row['peak_rss_mib']!s:>6} MiB"
                          f"  log {row['lines_per_connection']:>7}/conn  load {row['load']}  | {row['seen']}",
                          flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if options.json:
        Path(options.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
