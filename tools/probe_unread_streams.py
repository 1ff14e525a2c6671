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
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT / "tests")]
from soak import Launcher  # noqa: E402
from stream_clients import GrpcStream, Memory, SseStream, flood_request, notes  # noqa: E402

__all__ = ["main"]


def wait_for(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll `condition` until it holds or `timeout` s passed; whether it held."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def wait_for_starts(record_dir: Path, wanted: set[str], timeout: float = 60, quiet: float = 2.0) -> int:
    """How many of `wanted` started, once all did or none more did for `quiet` s (a stream runs a
    bounded number of its requests at once: the rest wait, unread, until one ends)."""
    deadline, count, changed = time.monotonic() + timeout, -1, time.monotonic()
    while time.monotonic() < deadline:
        now = len(notes(record_dir, "started") & wanted)
        if now != count:
            count, changed = now, time.monotonic()
        if count == len(wanted) or time.monotonic() - changed > quiet:
            break
        time.sleep(0.05)
    return count


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
    clients: list[GrpcStream | SseStream] = []
    ids: list[str] = []
    for index in range(options.streams):
        if options.protocol == "grpc":
            names = [f"w{wave}-{index}-{k}" for k in range(options.per_stream)]
            requests = [flood_request(name, record_dir, options.bytes) for name in names]
            clients.append(GrpcStream(server.grpc_url, requests))
        else:
            names = [f"w{wave}-{index}"]
            clients.append(SseStream(server.http_url, names[0], record_dir, options.bytes))
        ids += names
    wanted = set(ids)
    started = wait_for_starts(record_dir, wanted)
    peak = Memory.of(server.pid)
    hold_end = time.monotonic() + options.hold
    while time.monotonic() < hold_end:
        peak = peak.peak(Memory.of(server.pid))
        time.sleep(0.25)
    for client in clients:
        if isinstance(client, SseStream):
            client.leave("reset")
        else:
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
