#!/usr/bin/env python3
"""CPU per request, compiled hot path against pure Python: two pystub servers, same run.

Starts this checkout's pystub twice, one as built (the compiled modules of tools/build_compiled.py)
and one with PYSTUB_PURE_PYTHON=1, checks each reports the mode it should (`GET /v2/pystub/build`),
then for each cell sends a fixed number of requests from 8 client threads and reads the CPU time
the backend process and its stubs spent (/proc, every thread), per request, less their idle CPU
rate (read once per server, with no requests) over the same time. Rounds alternate which
server goes first; medians of the rounds are printed with the ratio pure ÷ compiled (> 1: the
compiled path spends less). CPU time per request does not depend on the load other processes put
on the machine the way throughput does.

Cells: `http` and `grpc` (identity_fp32, 16 B, unary), `stream` (a decoupled model's responses on
one gRPC stream, per response).

    .venv/bin/python tools/build_compiled.py && .venv/bin/python tools/bench_compiled.py
    .venv/bin/python tools/bench_compiled.py --cells grpc --requests 8000 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from compare import servers

ROOT = Path(__file__).resolve().parent.parent
_STREAM_MODEL = ROOT / "tests" / "differential" / "models" / "repeat"
_THREADS = 8
_TIMEOUT = 60.0  # s per call or per stream: a server that stops answering fails the run, naming itself
CELLS = ("http", "grpc", "stream")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(backend process, its descendants: the stubs) user + system CPU seconds."""
    backend = psutil.Process(pid)
    times = backend.cpu_times()
    stubs = 0.0
    for child in backend.children(recursive=True):
        try:
            child_times = child.cpu_times()
        except psutil.Error:
            continue  # gone between listing and reading
        stubs += child_times.user + child_times.system
    return times.user + times.system, stubs


def _in_threads(work: Callable[[int], None], count: int) -> None:
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            work(count // _THREADS)
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
            errors.append(error)
    threads = [threading.Thread(target=worker) for _ in range(_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"requests failed: {errors[0]}") from errors[0]


def drive_http(server: servers.Server, count: int) -> int:
    def work(calls: int) -> None:
        client = httpclient.InferenceServerClient(server.url("http"), network_timeout=_TIMEOUT)
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32), binary_data=True)
        try:
            for _ in range(calls):
                client.infer("identity_fp32", [tensor])
        finally:
            client.close()
    _in_threads(work, count)
    return count // _THREADS * _THREADS


def drive_grpc(server: servers.Server, count: int) -> int:
    def work(calls: int) -> None:
        client = grpcclient.InferenceServerClient(server.url("grpc"))
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        try:
            for _ in range(calls):
                client.infer("identity_fp32", [tensor], client_timeout=_TIMEOUT)
        finally:
            client.close()
    _in_threads(work, count)
    return count // _THREADS * _THREADS


def drive_stream(server: servers.Server, count: int) -> int:
    """One stream, one request whose decoupled model sends `count` responses; counts them."""
    received: queue.Queue[object] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.url("grpc"))
    client.start_stream(callback=lambda result, error: received.put(error or result))
    try:
        tensor = grpcclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([count], np.int32))
        client.async_stream_infer("repeat", [tensor], enable_empty_final_response=True)
        got = 0
        while True:
            item = received.get(timeout=_TIMEOUT)
            if not isinstance(item, grpcclient.InferResult):
                raise RuntimeError(f"stream from {server.name} failed: {item}")
            if item.get_response().parameters["triton_final_response"].bool_param:
                return got
            got += 1
    finally:
        client.stop_stream()
        client.close()


DRIVERS = {"http": drive_http, "grpc": drive_grpc, "stream": drive_stream}


def idle_rate(server: servers.Server, seconds: float) -> tuple[float, float]:
    """(backend, stubs) CPU seconds per second with no request: heartbeats, samplers, pollers."""
    before, start = cpu_seconds(server.process.pid), time.monotonic()
    time.sleep(seconds)
    after, elapsed = cpu_seconds(server.process.pid), time.monotonic() - start
    return (after[0] - before[0]) / elapsed, (after[1] - before[1]) / elapsed


def measure(server: servers.Server, cell: str, requests: int, warmup: int, idle: tuple[float, float],
            ) -> tuple[float, float]:
    """(backend, stubs) CPU microseconds per request (per response for `stream`), less what the
    processes spend idle over the same time (on a loaded machine requests are slow, and the idle
    cost per second would otherwise be charged to them)."""
    DRIVERS[cell](server, warmup)
    before, start = cpu_seconds(server.process.pid), time.monotonic()
    done = DRIVERS[cell](server, requests)
    after, elapsed = cpu_seconds(server.process.pid), time.monotonic() - start
    return tuple((after[i] - before[i] - idle[i] * elapsed) / done * 1e6 for i in (0, 1))  # type: ignore[return-value]


def build_mode(server: servers.Server) -> dict[str, object]:
    with urllib.request.urlopen(f"http://{server.url('http')}/v2/pystub/build", timeout=10) as response:
        return dict(json.load(response))


def start(workdir: Path, control: bool, compiled_root: Path | None) -> list[servers.Server]:
    """The `compiled` and `pure` servers. With `control`, the `compiled` one runs pure Python too (an
    A/A run: what the harness itself makes of two identical servers); with `compiled_root`, it runs
    from that copy of the checkout, whose extensions sit beside their sources (an in-place build by
    another compiler, e.g. mypyc), with the Cython tree's hook off."""
    repositories = servers.write_repositories(workdir)
    shutil.copytree(_STREAM_MODEL, repositories["models"] / "repeat")
    pure = {"PYSTUB_PURE_PYTHON": "1"}
    started = [servers.start_pystub(repositories, workdir, client_shm=False, name="compiled",
                                    root=compiled_root or ROOT,
                                    env_extra=pure if control or compiled_root else None),
               servers.start_pystub(repositories, workdir, client_shm=False, name="pure", env_extra=pure)]
    servers.wait_ready(started)
    for server in started:
        _wait_model(server, "repeat")
        mode = build_mode(server)
        if mode["mode"] != ("pure" if control or compiled_root else server.name):
            raise SystemExit(f"the {server.name} server runs {mode['mode']}: {mode['reason']}"
                             " (build first: tools/build_compiled.py)")
    return started


def _wait_model(server: servers.Server, model: str) -> None:
    deadline = time.monotonic() + 120
    url = f"http://{server.url('http')}/v2/models/{model}/ready"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{server.name}: model {model} not ready after 120 s:\n{server.log_tail()}")


def report(results: dict[tuple[str, str], list[tuple[float, float]]], cells: list[str]) -> None:
    print("\nCPU µs per request (stream: per response), medians of the rounds; ratio = pure ÷ compiled")
    print(f"{'cell':8} {'process':8} {'compiled':>9} {'pure':>9} {'ratio':>6}   rounds compiled | pure")
    for cell in cells:
        for index, process in enumerate(("backend", "stub")):
            fast = [r[index] for r in results[("compiled", cell)]]
            slow = [r[index] for r in results[("pure", cell)]]
            ratio = statistics.median(slow) / statistics.median(fast)
            print(f"{cell:8} {process:8} {statistics.median(fast):9.1f} {statistics.median(slow):9.1f} "
                  f"{ratio:6.2f}   {' '.join(f'{v:.0f}' for v in fast)} | {' '.join(f'{v:.0f}' for v in slow)}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default=",".join(CELLS), help=f"comma-separated, from {', '.join(CELLS)}")
    parser.add_argument("--requests", type=int, default=4000, help="requests (stream: responses) per measure")
    parser.add_argument("--warmup", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle-seconds", type=float, default=5.0,
                        help="how long each server's idle CPU rate is read (subtracted from each measure)")
    parser.add_argument("--control", action="store_true",
                        help="A/A: both servers pure Python (the harness's own bias and noise)")
    parser.add_argument("--compiled-root", type=Path,
                        help="run the compiled server from this checkout copy (extensions built in place)")
    args = parser.parse_args(argv)
    args.cells = [c for c in args.cells.split(",") if c]
    if not args.cells or set(args.cells) - set(CELLS):
        parser.error(f"--cells: choose from {', '.join(CELLS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="pystub-bench-compiled-") as tmp:
        started: list[servers.Server] = []
        try:
            started = start(Path(tmp), args.control, args.compiled_root)
            idle = {server.name: idle_rate(server, args.idle_seconds) for server in started}
            print("idle CPU s/s (backend, stubs): " + ", ".join(
                f"{name} {rate[0]:.3f} {rate[1]:.3f}" for name, rate in idle.items()), flush=True)
            for index in range(args.rounds):
                order = started if index % 2 == 0 else started[::-1]
                for cell in args.cells:
                    for server in order:
                        figures = measure(server, cell, args.requests, args.warmup, idle[server.name])
                        results.setdefault((server.name, cell), []).append(figures)
                        print(f"round {index + 1} {cell:6} {server.name:8} backend {figures[0]:7.1f} "
                              f"stub {figures[1]:7.1f} µs CPU/request", flush=True)
        finally:
            for server in reversed(started):
                servers.stop(server)
            servers.sweep_shm(started)
    report(results, args.cells)
    return 0


if __name__ == "__main__":
    sys.exit(main())
