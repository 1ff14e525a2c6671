"""Clients of the `flood` test model (tests/models/flood) that stop reading or leave mid-stream,
and the notes the model leaves in `record_dir` (which requests started, which saw is_cancelled()).

    GrpcStream(url, requests)        a `ModelStreamInfer` stream on a channel of its own, never read;
                                     leave(): cancel the call and close the channel
    SseStream(url, id, dir, ...)     an HTTP `generate_stream` on a raw socket, never read;
                                     leave("close") closes it, leave("reset") resets it (SO_LINGER 0)
    client_process(kind, url, ...)   the same from a subprocess, SIGKILLed by the caller
    Memory.of(pid)                   the RSS of a backend, its stubs and its workers
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
from tritonclient.grpc import service_pb2

__all__ = ["GrpcStream", "SseStream", "Memory", "flood_request", "notes", "wait_until", "client_process"]

_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"


def flood_request(request_id: str, record_dir: Path, size: int = 1024, count: int = 0,
                  pause_ms: float = 0) -> service_pb2.ModelInferRequest:
    """A `flood` request: `count` responses (0: until cancelled) of `size` bytes, `pause_ms` apart."""
    request = service_pb2.ModelInferRequest(model_name="flood", id=request_id)
    for name, value in (("COUNT", count), ("BYTES", size)):
        request.inputs.add(name=name, datatype="INT32", shape=[1])
        request.raw_input_contents.append(struct.pack("<i", value))
    request.parameters["record_dir"].string_param = str(record_dir)
    request.parameters["pause_ms"].double_param = pause_ms
    return request


class GrpcStream:
    """A stream that sends `requests` and never reads; it stays open (not half-closed) until `leave()`."""

    def __init__(self, url: str, requests: list[service_pb2.ModelInferRequest]) -> None:
        self._channel = grpc.insecure_channel(url)
        self._open = threading.Event()
        method = self._channel.stream_stream(
            _METHOD, request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString)
        self._call = method(self._requests(requests))

    def _requests(self, requests: list[service_pb2.ModelInferRequest]) -> Iterator[service_pb2.ModelInferRequest]:
        yield from requests
        self._open.wait(120)

    def leave(self) -> None:
        self._open.set()
        self._call.cancel()
        self._channel.close()


class SseStream:
    """A `generate_stream` request on a raw socket with a small receive buffer, never read."""

    def __init__(self, url: str, request_id: str, record_dir: Path, size: int = 1024, pause_ms: float = 0) -> None:
        host, port = url.rsplit(":", 1)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect((host, int(port)))
        body = json.dumps({"id": request_id, "COUNT": 0, "BYTES": size, "record_dir": str(record_dir),
                           "pause_ms": pause_ms}).encode()
        self.sock.sendall(b"POST /v2/models/flood/generate_stream HTTP/1.1\r\nHost: test\r\n"
                          b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    def leave(self, how: str = "close") -> None:
        if how == "reset":
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


_CLIENT = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from stream_clients import GrpcStream, SseStream, flood_request
kind, url, record_dir, prefix, count, pause_ms = sys.argv[2], sys.argv[3], Path(sys.argv[4]), sys.argv[5], \
    int(sys.argv[6]), float(sys.argv[7])
if kind == "grpc":
    GrpcStream(url, [flood_request(f"{prefix}-{k}", record_dir, pause_ms=pause_ms) for k in range(count)])
else:
    clients = [SseStream(url, f"{prefix}-{k}", record_dir, pause_ms=pause_ms) for k in range(count)]
print("sent", flush=True)
time.sleep(120)
"""


def client_process(kind: str, url: str, record_dir: Path, prefix: str, count: int,
                   pause_ms: float = 0) -> subprocess.Popen[bytes]:
    """A subprocess holding `count` unread requests (one gRPC stream, or `count` SSE connections),
    until it is killed (at most 120 s)."""
    return subprocess.Popen([sys.executable, "-c", _CLIENT, os.path.dirname(__file__), kind, url, str(record_dir),
                             prefix, str(count), str(pause_ms)], stdout=subprocess.PIPE)


def notes(record_dir: Path, suffix: str, prefix: str = "") -> set[str]:
    """The ids (starting with `prefix`) of the requests for which `flood` noted `suffix`."""
    return {path.stem for path in record_dir.glob(f"{prefix}*.{suffix}")}


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll `condition` until it holds; the seconds that took. Raises AssertionError naming `what`."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)
    return time.monotonic() - started


MIB = 1 << 20


@dataclass
class Memory:
    """RSS in MiB of a backend, its stubs (summed) and its frontend workers (summed)."""

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

    def growth(self, before: Memory) -> Memory:
        return Memory(self.backend - before.backend, self.stubs - before.stubs, self.workers - before.workers)

    def __str__(self) -> str:
        return f"backend {self.backend:7.1f}  stubs {self.stubs:7.1f}  workers {self.workers:7.1f} MiB"
