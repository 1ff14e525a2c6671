#!/usr/bin/env python3
"""CPU per small request in the backend process and in its stubs: this checkout beside another.

Throughput on a shared machine moves with everything else running on it; the CPU time a process
spends per request moves much less. This starts pystub-backend from this checkout and from
`--baseline` (another checkout, e.g. main) in turn, drives identity_fp32 with 16 B tensors
(`--size`) at concurrency C for S seconds with the asyncio load generator of tools/compare, and
reads the processes' own CPU time (utime + stime from /proc) before and after the window:

    backend us/req   CPU of the pystub-backend process / requests served
    stubs us/req     CPU of its descendants (the stub processes) / requests served

Rounds alternate baseline and this checkout, so both see the same load; the table gives the
median of the rounds and the ratio. Linux only (reads /proc). Exits 0.

    .venv/bin/python tools/bench_hot_path_steps.py --baseline ../main --protocols http,grpc
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import cpu, loadgen, servers  # noqa: E402


def _cpu(pid: int) -> tuple[float, float]:
    """(backend, stubs) CPU seconds so far."""
    return cpu.process_seconds(pid), sum(cpu.process_seconds(child) for child in cpu.descendants(pid))


def _round(root: Path, protocol: str, args: argparse.Namespace) -> tuple[float, float, float]:
    """(backend us/req, stubs us/req, infer/s) of one server from `root`."""
    with tempfile.TemporaryDirectory(prefix="pystub-steps-") as tmp:
        workdir = Path(tmp)
        server = servers.start_pystub(servers.write_repositories(workdir), workdir, client_shm=False, root=root)
        try:
            servers.wait_ready([server])
            point = loadgen.Point("identity_fp32", args.size, args.concurrency, protocol)
            asyncio.run(loadgen.measure(server.url(protocol), point, 0.0, 1.0))  # warm-up
            before = _cpu(server.process.pid)
            sample = asyncio.run(loadgen.measure(server.url(protocol), point, 0.0, args.seconds))
            after = _cpu(server.process.pid)
        finally:
            servers.stop(server)
    requests = max(1.0, sample.throughput * args.seconds)
    return ((after[0] - before[0]) / requests * 1e6, (after[1] - before[1]) / requests * 1e6, sample.throughput)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="the other checkout (e.g. main)")
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=16, help="bytes per input tensor (default 16)")
    args = parser.parse_args()
    checkouts = {"baseline": args.baseline.resolve(), "this": ROOT}
    print(f"identity_fp32 {args.size} B, concurrency {args.concurrency}, {args.seconds:g} s x {args.rounds} "
          f"rounds (medians; asyncio load generator)")
    print(f"{'protocol':8} {'checkout':9} {'backend us/req':>15} {'stubs us/req':>13} {'infer/s':>8}")
    for protocol in args.protocols.split(","):
        results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in checkouts}
        for _ in range(args.rounds):
            for name, root in checkouts.items():
                results[name].append(_round(root, protocol, args))
        medians = {name: [statistics.median(column) for column in zip(*rows, strict=True)]
                   for name, rows in results.items()}
        for name, (backend, stubs, rate) in medians.items():
            print(f"{protocol:8} {name:9} {backend:15.1f} {stubs:13.1f} {rate:8.0f}")
        base, this = medians["baseline"], medians["this"]
        print(f"{protocol:8} {'ratio':9} {this[0] / base[0]:15.2f} {this[1] / base[1]:13.2f} {this[2] / base[2]:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
