#!/usr/bin/env python3
"""CPU time per gRPC call: what each server's process group spends on one 16 B ModelInfer.

Throughput on a shared machine mixes a server's cost with who got the cores; the CPU time its
process group spends per call does not (every process and thread counts: grpc's pollers, Rust I/O
threads, Python stubs). Each server is started as tools/bench_compare.py starts it, warmed up,
then sent a fixed number of calls from tritonclient in 8 threads; its group's CPU time before and
after, divided by the calls, is the figure. Servers are measured in turn, rounds rotating the order.
Resolution: process CPU times tick every 10 ms, so 4000 calls read to about ±2.5 µs per call.

    .venv/bin/python tools/grpc_cpu_cost.py --servers triton,pystub,bare-grpc-aio,bare-grpc-ngh2-asyncio
    .venv/bin/python tools/grpc_cpu_cost.py --servers triton,pystub-h2,pystub-aio   # the two gRPC stacks
    .venv/bin/python tools/grpc_cpu_cost.py --servers triton,pystub-h2,pystub-aio --stream   # ModelStreamInfer

Servers: pystub (its default gRPC stack), pystub-h2 and pystub-aio (--grpc-server=h2|aio), triton
(tools/triton_env.py installs it) and every bare gRPC ceiling of compare/bare.py (the PyPI ones from
the candidates' venv). Nothing is installed here: run tools/triton_env.py (Triton) or bench_compare
once without --no-install (the candidates) first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
import triton_env
import tritonclient.grpc as grpcclient
from compare import environment, servers
from compare.main import CEILINGS, PYPI_CEILINGS

_THREADS = 8
_PYSTUB_STACKS = {"pystub-h2": "h2", "pystub-aio": "aio"}
_CALL_TIMEOUT = 30.0  # s per call: a server that stops answering fails the run, naming itself


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of every live process in group `pgid` (threads included)."""
    total = 0.0
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid:
                times = process.cpu_times()
                total += times.user + times.system
        except (psutil.Error, ProcessLookupError):
            continue  # gone between listing and reading
    return total


def _unary(client: grpcclient.InferenceServerClient, tensor: grpcclient.InferInput, count: int) -> None:
    for _ in range(count):
        client.infer("identity_fp32", [tensor], client_timeout=_CALL_TIMEOUT)


def _streamed(client: grpcclient.InferenceServerClient, tensor: grpcclient.InferInput, count: int) -> None:
    answered: list[object] = []
    client.start_stream(callback=lambda result, error: answered.append(error or result),
                        stream_timeout=_CALL_TIMEOUT * 10)
    for _ in range(count):
        client.async_stream_infer("identity_fp32", [tensor])
    client.stop_stream()  # returns once the server has answered every request and closed
    failed = [item for item in answered if isinstance(item, BaseException)]
    if failed or len(answered) != count:
        raise RuntimeError(f"{len(answered)} of {count} streamed requests answered: {failed[:1]}")


_Calls = Callable[[grpcclient.InferenceServerClient, grpcclient.InferInput, int], None]


def drive(url: str, calls: int, send: _Calls = _unary) -> None:
    """`calls` 16 B identity_fp32 inferences over gRPC from `_THREADS` threads, each with its own
    client (`_streamed`: each over one ModelStreamInfer stream); raises what failed."""
    errors: list[BaseException] = []

    def worker(count: int) -> None:
        client = grpcclient.InferenceServerClient(url)
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        try:
            send(client, tensor, count)
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
            errors.append(error)
        finally:
            client.close()
    threads = [threading.Thread(target=worker, args=(calls // _THREADS,)) for _ in range(_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"calls to {url} failed: {errors[0]}") from errors[0]


def measure(server: servers.Server, calls: int, warmup: int, stream: bool = False) -> float:
    """CPU microseconds `server`'s process group spent per call (per streamed request: `stream`)."""
    send = _streamed if stream else _unary
    drive(server.url("grpc"), warmup, send)
    before = group_cpu_seconds(server.process.pid)
    drive(server.url("grpc"), calls, send)
    return (group_cpu_seconds(server.process.pid) - before) / (calls // _THREADS * _THREADS) * 1e6


def _start(name: str, workdir: Path, repositories: dict[str, Path]) -> servers.Server:
    if name == "pystub":
        return servers.start_pystub(repositories, workdir, client_shm=False)
    if name in _PYSTUB_STACKS:
        return servers.start_pystub(repositories, workdir, client_shm=False, name=name,
                                    extra=[f"--grpc-server={_PYSTUB_STACKS[name]}"])
    if name == "triton":
        # Triton alone (tools/triton_env.py installs it): the benchmark's other peers are not needed here
        return servers.start_triton(triton_env.ensure_triton(install=False), repositories, workdir)
    python = environment.ensure_candidates(install=False) if name in PYPI_CEILINGS else None
    return servers.start_bare(name, workdir, python)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    bare = (c for c in (*CEILINGS, *PYPI_CEILINGS) if c.startswith("bare-grpc"))
    choices = ("pystub", *_PYSTUB_STACKS, "triton", *bare)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="pystub,bare-grpc-aio",
                        help=f"comma-separated, from: {', '.join(choices)}")
    parser.add_argument("--calls", type=int, default=4000, help="calls measured per server per round")
    parser.add_argument("--warmup", type=int, default=400, help="calls before each measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stream", action="store_true",
                        help="send the requests over ModelStreamInfer (one stream per thread) instead of ModelInfer")
    args = parser.parse_args(argv)
    args.servers = [s for s in args.servers.split(",") if s]
    bad = [s for s in args.servers if s not in choices]
    if bad or not args.servers:
        parser.error(f"unknown server(s) {', '.join(bad)}; choose from {', '.join(choices)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started: list[servers.Server] = []
    with tempfile.TemporaryDirectory(prefix="pystub-cpu-cost-") as tmp:
        workdir = Path(tmp)
        repositories = servers.write_repositories(workdir)
        try:
            for name in args.servers:
                started.append(_start(name, workdir, repositories))
            servers.wait_ready(started)
            results: dict[str, list[float]] = {server.name: [] for server in started}
            for index in range(args.rounds):
                order = started[index % len(started):] + started[:index % len(started)]
                for server in order:
                    results[server.name].append(measure(server, args.calls, args.warmup, args.stream))
                    print(f"round {index + 1} {server.name:24} {results[server.name][-1]:7.1f} µs CPU/call",
                          flush=True)
        finally:
            for server in reversed(started):
                servers.stop(server)
            servers.sweep_shm(started)
    what = "streamed request (ModelStreamInfer)" if args.stream else "call"
    print(f"server CPU per 16 B gRPC {what}, {args.calls} calls x {args.rounds} rounds, median (rounds):")
    for name, values in results.items():
        print(f"  {name:24} {statistics.median(values):7.1f} µs  ({', '.join(f'{v:.0f}' for v in values)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
