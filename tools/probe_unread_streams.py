"""Probe: clients that open a stream to a decoupled model and never read it, then leave.

Starts its own backend (loopback, ephemeral ports, optionally `--frontend-workers N`) serving the
`flood` test model (tests/models/flood: BYTES-byte responses until cancelled), then runs WAVES
waves of STREAMS clients. Each client opens its own connection (a gRPC `ModelStreamInfer` stream
or an HTTP `generate_stream`), sends one request and never reads; after HOLD seconds every client
leaves (gRPC: cancels and closes its channel; HTTP: closes its socket with SO_LINGER 0, a reset).

Measured with psutil: the RSS of the backend, its stubs and its workers before the first wave,
at the peak of each wave, and after each wave's clients left; and for each request how it ended
(the model notes it: cancelled, refused by a full window, or still running) and how long after
the clients left the last one was cancelled. Stops by itself; the backend is stopped at the end.

    python tools/probe_unread_streams.py --streams 100 --bytes 16384 [--protocol grpc|sse] [--workers 2]
                                         [--per-stream 5] [--hold 8] [--waves 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
from tritonclient.grpc import service_pb2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import Launcher  # noqa: E402

__all__ = ["UnreadGrpcStream", "UnreadSseStream", "flood_request", "notes", "main"]

MIB = 1 << 20
_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"


def flood_request(request_id: str, size: int, record_dir: str, count: int = 0) -> service_pb2.ModelInferRequest:
    """A `flood` request: `count` responses (0: until cancelled) of `size` bytes each."""
    request = service_pb2.ModelInferRequest(model_name="flood", id=request_id)
    for name, value in (("COUNT", count), ("BYTES", size)):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1])
        del tensor  # the value travels in raw_input_contents, in input order
        request.raw_input_contents.append(struct.pack("<i", value))
    request.parameters["record_dir"].string_param = record_dir
    return request


class UnreadGrpcStream:
    """A gRPC stream on a channel of its own that sends `requests` and never reads its responses.
    `leave()` cancels the call and closes the channel (RST_STREAM, then the connection goes)."""

    def __init__(self, url: str, requests: list[service_pb2.ModelInferRequest]) -> None:
        self._channel = grpc.insecure_channel(url, options=[("grpc.max_receive_message_length", -1)])
        self._open = threading.Event()
        method = self._channel.stream_stream(
            _METHOD, request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString)
        self._call = method(self._requests(requests))

    def _requests(self, requests: list[service_pb2.ModelInferRequest]):  # type: ignore[no-untyped-def]
        yield from requests
        self._open.wait(600)  # the stream stays open (not half-closed) until the client leaves

    def leave(self) -> None:
        self._open.set()
        self._call.cancel()
        self._channel.close()


class UnreadSseStream:
    """An HTTP `generate_stream` on a socket of its own (a small receive buffer) that is never read.
    `leave()` resets the connection (SO_LINGER 0)."""

    def __init__(self, url: str, request_id: str, size: int, record_dir: str) -> None:
        host, port = url.rsplit(":", 1)
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self._sock.connect((host, int(port)))
        body = json.dumps({"id": request_id, "COUNT": 0, "BYTES": size, "record_dir": record_dir}).encode()
        self._sock.sendall(b"POST /v2/models/flood/generate_stream HTTP/1.1\r\nHost: probe\r\n"
                           b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    def leave(self) -> None:
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._sock.close()


def notes(record_dir: Path, suffix: str) -> set[str]:
    """The ids of the requests for which the flood model noted `suffix` (started, cancelled, ...)."""
    return {path.stem for path in record_dir.glob(f"*.{suffix}")}


def wait_for(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll `condition` until it holds or `timeout` s passed; whether it held."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@dataclass
class Memory:
    """RSS in MiB of the backend, its stubs (summed) and its workers (summed)."""

    backend: float
    stubs: float
    workers: float

    @classmethod
    def of(cls, pid: int) -> Memory:
        backend = psutil.Process(pid)
        stubs = workers = 0
        for child in backend.children(recursive=True):
            try:
                rss, line = child.memory_info().rss, " ".join(child.cmdline())
            except psutil.Error:
                continue
            if "workers.worker" in line:
                workers += rss
            else:
                stubs += rss
        return cls(backend.memory_info().rss / MIB, stubs / MIB, workers / MIB)

    def peak(self, other: Memory) -> Memory:
        return Memory(max(self.backend, other.backend), max(self.stubs, other.stubs), max(self.workers, other.workers))

    def __str__(self) -> str:
        return f"backend {self.backend:7.1f}  stubs {self.stubs:7.1f}  workers {self.workers:7.1f} MiB"


@dataclass
class Wave:
    peak: Memory
    after: Memory
    started: int
    cancelled: int
    refused: int
    running: int  # neither cancelled nor refused CANCEL_WAIT s after the clients left
    last_end_s: float  # when the last request ended, after the clients left


CANCEL_WAIT = 10.0


def run_wave(server: Launcher, options: argparse.Namespace, record_dir: Path, wave: int) -> Wave:
    clients: list[UnreadGrpcStream | UnreadSseStream] = []
    ids: list[str] = []
    for index in range(options.streams):
        if options.protocol == "grpc":
            names = [f"w{wave}-{index}-{k}" for k in range(options.per_stream)]
            requests = [flood_request(name, options.bytes, str(record_dir)) for name in names]
            clients.append(UnreadGrpcStream(server.grpc_url, requests))
        else:
            names = [f"w{wave}-{index}"]
            clients.append(UnreadSseStream(server.http_url, names[0], options.bytes, str(record_dir)))
        ids += names
    wanted = set(ids)
    wait_for(lambda: len(notes(record_dir, "started") & wanted) == len(wanted), 60)
    started = len(notes(record_dir, "started") & wanted)
    peak = Memory.of(server.pid)
    hold_end = time.monotonic() + options.hold
    while time.monotonic() < hold_end:
        peak = peak.peak(Memory.of(server.pid))
        time.sleep(0.25)
    for client in clients:
        client.leave()
    left = time.monotonic()

    def running() -> set[str]:
        ended = notes(record_dir, "cancelled") | notes(record_dir, "refused") | notes(record_dir, "done")
        return (notes(record_dir, "started") & wanted) - ended

    wait_for(lambda: not running(), CANCEL_WAIT)
    last_end = time.monotonic() - left
    time.sleep(1.0)  # let freed memory settle before the "after" sample
    cancelled, refused = notes(record_dir, "cancelled") & wanted, notes(record_dir, "refused") & wanted
    return Wave(peak, Memory.of(server.pid), started, len(cancelled), len(refused), len(running()), last_end)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--bytes", type=int, default=16384, help="bytes per response")
    parser.add_argument("--protocol", choices=("grpc", "sse"), default="grpc")
    parser.add_argument("--per-stream", type=int, default=1, help="requests on each gRPC stream")
    parser.add_argument("--workers", type=int, default=0, help="--frontend-workers")
    parser.add_argument("--hold", type=float, default=8.0, help="seconds the clients stay without reading")
    parser.add_argument("--waves", type=int, default=2)
    options = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="probe-unread-"))
    try:
        repository = work / "models"
        shutil.copytree(ROOT / "tests" / "models" / "flood", repository / "flood")
        record_dir = work / "notes"
        record_dir.mkdir()
        flags = [f"--frontend-workers={options.workers}"] if options.workers else []
        server = Launcher(repository, flags, [])
        try:
            time.sleep(1.0)
            before = Memory.of(server.pid)
            print(f"{options.streams} unread {options.protocol} streams ({options.per_stream} request(s) each) of "
                  f"{options.bytes}-byte responses, "
                  f"workers {options.workers}, hold {options.hold:g} s")
            print(f"before      {before}")
            for wave in range(1, options.waves + 1):
                result = run_wave(server, options, record_dir, wave)
                print(f"wave {wave} peak {result.peak}")
                print(f"wave {wave} after {result.after}")
                print(f"wave {wave}: {result.started} started, {result.cancelled} cancelled, {result.refused} refused, "
                      f"{result.running} still running {CANCEL_WAIT:g} s after the clients left; "
                      f"last ended {result.last_end_s:.2f} s after")
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
