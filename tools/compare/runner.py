"""The rounds: every point on every server with every load generator that can drive it, interleaved."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from compare import loadgen, perf_analyzer, pipelines, prebuilt, stopping, streaming, wrk_h2load
from compare.environment import BenchEnv
from compare.loadgen import Point
from compare.report import Results, size_text
from compare.servers import Server

SHM_EXTENSION = "system_shared_memory"
# the servers that run Python-backend models (the pipeline cells, the streamed responses)
_MODEL_SERVERS = ("pystub", "pystub-base", "triton")
# the servers the C load generators drive: they serve the statistics their check reads
_WRK_SERVERS = ("floor", *_MODEL_SERVERS)
_PROBE = Path(__file__).with_name("probe.py")


@dataclass
class Plan:
    """What to measure, where and how."""

    servers: dict[str, Server]
    env: BenchEnv | None
    results: Results
    points: list[Point]
    loadgens: list[str]
    rounds: int
    warmup: float
    seconds: float
    probe: bool
    stream_responses: int = 500

    @classmethod
    def from_args(cls, args: argparse.Namespace, servers: dict[str, Server], env: BenchEnv | None,
                  results: Results) -> Plan:
        unary = any(name != "stream" for name in args.loadgen)
        points = [Point("identity_fp32", size, c, proto)
                  for size in args.sizes for c in args.concurrency for proto in args.protocols
                  if "identity_fp32" in args.models and unary]
        if "add_sub" in args.models and unary:
            points += [Point("add_sub", 16, c, proto) for c in args.concurrency for proto in args.protocols]
        if "stream" in args.loadgen:
            points += [Point(streaming.MODEL, 16, s, proto) for s in args.streams for proto in args.stream_protocols]
        if "pipelines" in args.models and "perf_analyzer" in args.loadgen:
            points += list(pipelines.CELLS)
        if not args.no_shm and args.sizes and unary:
            largest = max(args.sizes)
            points += [Point("identity_fp32", largest, c, proto, shm=True)
                       for c in args.concurrency for proto in args.protocols]
            pystub = servers.get("pystub")
            if pystub is not None and SHM_EXTENSION not in pystub.extensions:
                results.notes.append(f"pystub's server metadata does not list {SHM_EXTENSION}: its client "
                                     "shared-memory rows are skipped")
        return cls(servers=servers, env=env, results=results, points=points, loadgens=list(args.loadgen),
                   rounds=args.rounds, warmup=args.warmup, seconds=args.seconds, probe=not args.no_probe,
                   stream_responses=args.stream_responses)

    def applies(self, loadgen_name: str, server: Server, point: Point) -> bool:
        if (loadgen_name == "stream") != (point.model == streaming.MODEL):
            return False
        if loadgen_name == "stream":  # a decoupled Python-backend model: pystub and Triton serve it
            return server.name in _MODEL_SERVERS
        if point.model in pipelines.MODELS:  # perf_analyzer over gRPC, on the servers that run them
            return loadgen_name == "perf_analyzer" and server.name in _MODEL_SERVERS
        if point.shm and SHM_EXTENSION not in server.extensions:
            return False
        if server.name == "floor" and (point.model != "identity_fp32" or point.protocol not in ("http", "grpc")):
            return False
        if loadgen_name == "wrk-h2load":
            return server.name in _WRK_SERVERS and point.model == "identity_fp32" and not point.shm \
                and point.protocol in ("http", "grpc")
        if server.name.startswith("bare-"):  # identity_fp32 only, over the candidate's own protocol
            wanted = ("grpc",) if server.name.startswith("bare-grpc") else ("http", "json")
            if point.model != "identity_fp32" or point.protocol not in wanted:
                return False
        if loadgen_name == "prebuilt":
            return point.protocol == "json" and not point.shm
        if loadgen_name == "perf_analyzer":
            if point.protocol == "json":  # perf_analyzer sends binary tensors only
                return False
            return server.name in _WRK_SERVERS or server.name.startswith("bare-")
        return True


def _protocol(server: Server, point: Point) -> Point:
    """MLServer has no binary tensor extension over HTTP: its HTTP points send JSON tensors."""
    if server.name == "mlserver" and point.protocol == "http":
        return Point(point.model, point.nbytes, point.concurrency, "http-json", point.shm)
    return point


def _measure(plan: Plan, loadgen_name: str, server: Server, point: Point) -> None:
    stopping.check()
    point = _protocol(server, point)
    try:
        if loadgen_name == "wrk-h2load":
            sample = wrk_h2load.measure(server, point, plan.warmup, plan.seconds)
        elif loadgen_name == "perf_analyzer":
            if point.model in pipelines.MODELS:
                pipelines.check(server.url("grpc"), point.model)
            window_ms = max(500, int(1000 * plan.seconds / 2))
            sample = perf_analyzer.measure(plan.env, server.url(point.protocol), server.process.pid, point, window_ms)
        elif loadgen_name == "stream":
            url = server.url("grpc" if point.protocol == "grpc" else "http")
            sample = asyncio.run(streaming.measure(url, server.process.pid, point, plan.stream_responses,
                                                   plan.warmup, plan.seconds))
        elif loadgen_name == "prebuilt":
            sample = asyncio.run(prebuilt.measure(server.url(point.protocol), point, plan.warmup, plan.seconds))
        else:
            sample = asyncio.run(loadgen.measure(server.url(point.protocol), point, plan.warmup, plan.seconds))
    except stopping.StopRequested:
        raise
    except Exception as error:  # one failed point (e.g. a size a peer refuses) must not end the run
        plan.results.fail(loadgen_name, server.name, point, f"{type(error).__name__}: {error}")
        reason = str(error).splitlines()[0][:200] if str(error) else repr(error)
        print(f"    {server.name:8} {loadgen_name:13} failed: {reason}", file=sys.stderr, flush=True)
        return
    plan.results.add(loadgen_name, server.name, point, sample)
    cpu = f" cpu/resp server {sample.cpu_server_us:.0f} stubs {sample.cpu_children_us:.0f} client " \
          f"{sample.cpu_client_us:.0f} us" if loadgen_name in ("stream", "perf_analyzer", "wrk-h2load") else ""
    print(f"    {server.name:8} {loadgen_name:13} {sample.throughput:9.1f}/s p50 {sample.p50_ms:8.2f} ms "
          f"p99 {sample.p99_ms:8.2f} ms{cpu}", file=sys.stderr, flush=True)


def _probe(plan: Plan, server: Server) -> None:
    """Health/metadata latency from another process while 32 small gRPC inferences are in flight."""
    stopping.check()
    seconds = plan.warmup + plan.seconds
    probe = subprocess.Popen([sys.executable, str(_PROBE), server.url("http"), "identity_fp32", str(seconds)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        asyncio.run(loadgen.measure(server.url("grpc"), Point("identity_fp32", 16, 32, "grpc"), 0.0, seconds))
        out, err = probe.communicate(timeout=seconds + 60)
        plan.results.probes[server.name].append(json.loads(out))
        print(f"    {server.name:8} probe         {out.strip()}", file=sys.stderr, flush=True)
    except stopping.StopRequested:
        raise
    except Exception as error:  # reported, not fatal
        plan.results.notes.append(f"probe on {server.name} failed: {error!r}")
    finally:
        if probe.poll() is None:
            probe.kill()
            probe.wait()


def run_rounds(plan: Plan) -> None:
    """All rounds; each round rotates the server order so none always goes first."""
    names = list(plan.servers)
    for index in range(plan.rounds):
        order = names[index % len(names):] + names[:index % len(names)]
        print(f"round {index + 1}/{plan.rounds}", file=sys.stderr, flush=True)
        for point in plan.points:
            print(f"  {point.model} {size_text(point.nbytes)}{' shm' if point.shm else ''} c={point.concurrency} "
                  f"{point.protocol}", file=sys.stderr, flush=True)
            for name in order:
                for loadgen_name in plan.loadgens:
                    if plan.applies(loadgen_name, plan.servers[name], point):
                        _measure(plan, loadgen_name, plan.servers[name], point)
        if plan.probe:
            print("  health/metadata under saturation", file=sys.stderr, flush=True)
            for name in order:
                _probe(plan, plan.servers[name])
        plan.results.rounds = index + 1
