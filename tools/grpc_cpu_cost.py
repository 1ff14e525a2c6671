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
    .venv/bin/python tools/grpc_cpu_cost.py --servers triton,pystub-h2,pystub-aio --bytes 1M --threads 1 \
        --calls 300 --warmup 30        # 1 MiB at concurrency 1: CPU per call and the latency's median

Unary calls also print the median of the calls' latencies (client side, every call of the round).

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
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
import triton_env
import tritonclient.grpc as grpcclient
from compare import environment, servers
from compare.main import CEILINGS, PYPI_CEILINGS

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


def _unary(client: grpcclient.InferenceServerClient, tensor: grpcclient.InferInput, count: int,
           latencies: list[float]) -> None:
    for _ in range(count):
        started = time.perf_counter()
        client.infer("identity_fp32", [tensor], client_timeout=_CALL_TIMEOUT)
        latencies.append(time.perf_counter() - started)


def _streamed(client: grpcclient.InferenceServerClient, tensor: grpcclient.InferInput, count: int,
              latencies: list[float]) -> None:
    answered: list[object] = []
    client.start_stream(callback=lambda result, error: answered.append(error or result),
                        stream_timeout=_CALL_TIMEOUT * 10)
    for _ in range(count):
        client.async_stream_infer("identity_fp32", [tensor])
    client.stop_stream()  # returns once the server has answered every request and closed
    failed = [item for item in answered if isinstance(item, BaseException)]
    if failed or len(answered) != count:
        raise RuntimeError(f"{len(answered)} of {count} streamed requests answered: {failed[:1]}")


_Calls = Callable[[grpcclient.InferenceServerClient, grpcclient.InferInput, int, list[float]], None]


def drive(url: str, calls: int, send: _Calls = _unary, size: int = 16, threads_count: int = 8) -> list[float]:
    """`calls` identity_fp32 inferences of `size` bytes over gRPC from `threads_count` threads, each
    with its own client (`_streamed`: each over one ModelStreamInfer stream); the unary calls'
    latencies in seconds. Raises what failed."""
    errors: list[BaseException] = []
    latencies: list[float] = []

    def worker(count: int) -> None:
        client = grpcclient.InferenceServerClient(url)
        tensor = grpcclient.InferInput("INPUT0", [1, max(1, size // 4)], "FP32")
        tensor.set_data_from_numpy(np.ones((1, max(1, size // 4)), np.float32))
        try:
            send(client, tensor, count, latencies)
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
            errors.append(error)
        finally:
            client.close()
    threads = [threading.Thread(target=worker, args=(calls // threads_count,)) for _ in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"calls to {url} failed: {errors[0]}") from errors[0]
    return latencies


def measure(server: servers.Server, args: argparse.Namespace) -> tuple[float, float | None]:
    """CPU microseconds `server`'s process group spent per call (per streamed request: `--stream`),
    and the median latency in ms of the unary calls (None for streams)."""
    send = _streamed if args.stream else _unary
    drive(server.url("grpc"), args.warmup, send, args.bytes, args.threads)
    before = group_cpu_seconds(server.process.pid)
    latencies = drive(server.url("grpc"), args.calls, send, args.bytes, args.threads)
    cpu = (group_cpu_seconds(server.process.pid) - before) / (args.calls // args.threads * args.threads) * 1e6
    return cpu, statistics.median(latencies) * 1e3 if latencies else None


def _size(text: str) -> int:
    """Bytes from `16`, `64K`, `1M`."""
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1:].upper() in units else int(text)


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
    parser.add_argument("--bytes", type=_size, default=16, help="bytes per request tensor (16, 64K, 1M; default 16)")
    parser.add_argument("--threads", type=int, default=8, help="client threads, one call in flight each (default 8)")
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
            p50s: dict[str, list[float]] = {server.name: [] for server in started}
            for index in range(args.rounds):
                order = started[index % len(started):] + started[:index % len(started)]
                for server in order:
                    cpu, p50 = measure(server, args)
                    results[server.name].append(cpu)
                    p50s[server.name] += [] if p50 is None else [p50]
                    print(f"round {index + 1} {server.name:24} {cpu:7.1f} µs CPU/call"
                          + ("" if p50 is None else f"  p50 {p50:.2f} ms"), flush=True)
        finally:
            for server in reversed(started):
                servers.stop(server)
            servers.sweep_shm(started)
    what = "streamed request (ModelStreamInfer)" if args.stream else "call"
    print(f"server CPU per {args.bytes} B gRPC {what}, {args.threads} threads, {args.calls} calls x {args.rounds} "
          "rounds, median (rounds):")
    for name, values in results.items():
        latency = p50s[name]
        print(f"  {name:24} {statistics.median(values):7.1f} µs  ({', '.join(f'{v:.0f}' for v in values)})"
              + (f"  p50 {statistics.median(latency):.2f} ms ({', '.join(f'{v:.2f}' for v in latency)})"
                 if latency else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
