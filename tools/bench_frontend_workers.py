"""Throughput of `--frontend-workers N` inference (the core link's hot path), this checkout against
a baseline checkout, in the same run: the two servers take turns, round after round, so a busy
machine slows both alike.

    python tools/bench_frontend_workers.py --baseline /path/to/other/checkout [--workers 2]
        [--rounds 3] [--seconds 5] [--concurrency 8] [--elements 16]

Each round starts one server per checkout on examples/models (`identity_fp32`), sends JSON infer
requests over HTTP from `concurrency` keep-alive connections for `seconds`, and stops it. Prints
requests per second of each round, the medians, and the ratio this/baseline (higher is better).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
_HTTP_PORT = re.compile(r"Started HTTPService at [\d.]+:(\d+)")


def _start(root: Path, workers: int, log_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A server running the code of `root`; exits with its log when it is not up within 120 s."""
    env = dict(os.environ, PYTHONPATH=str(root))
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "pystub_backend.backend", "--model-repository",
                                    str(ROOT / "examples" / "models"), "--http-port", "0", "--grpc-port", "0",
                                    "--metrics-port", "0", f"--frontend-workers={workers}"],
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(root),
                                   env=env, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        match = _HTTP_PORT.search(log_path.read_text(errors="replace"))
        if match:
            return process, int(match.group(1))
        if process.poll() is not None:
            break
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGKILL)
    raise SystemExit(f"the server of {root} did not start:\n{log_path.read_text(errors='replace')}")


async def _load(port: int, seconds: float, concurrency: int, elements: int) -> float:
    """Requests per second answered 200 over `seconds`."""
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, elements],
                        "data": [float(i) for i in range(elements)]}]}
    url = f"http://127.0.0.1:{port}/v2/models/identity_fp32/infer"
    done = 0

    async def client(session: aiohttp.ClientSession, until: float) -> None:
        nonlocal done
        while time.monotonic() < until:
            async with session.post(url, json=body) as response:
                await response.read()
                if response.status != 200:
                    raise SystemExit(f"infer answered {response.status}")
                done += 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        await asyncio.gather(*(client(session, time.monotonic() + 1.0) for _ in range(concurrency)))  # warm-up
        done = 0
        started = time.monotonic()
        await asyncio.gather(*(client(session, started + seconds) for _ in range(concurrency)))
        return done / (time.monotonic() - started)


def _round(root: Path, args: argparse.Namespace, log_path: Path) -> float:
    process, port = _start(root, args.workers, log_path)
    try:
        return asyncio.run(_load(port, args.seconds, args.concurrency, args.elements))
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="the other checkout's root")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--elements", type=int, default=16)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"this": [], "baseline": []}
    with tempfile.TemporaryDirectory(prefix="bench-frontend-workers-") as scratch:
        for number in range(args.rounds):
            for name, root in (("baseline", args.baseline.resolve()), ("this", ROOT)):
                rate = _round(root, args, Path(scratch) / f"{name}-{number}.log")
                rates[name].append(rate)
                print(f"round {number + 1} {name:8} {rate:8.1f} req/s", flush=True)
    this, baseline = statistics.median(rates["this"]), statistics.median(rates["baseline"])
    print(f"median: this {this:.1f} req/s, baseline {baseline:.1f} req/s, ratio this/baseline {this / baseline:.3f} "
          f"(--frontend-workers {args.workers}, concurrency {args.concurrency}, {args.elements} FP32, JSON over HTTP)")


if __name__ == "__main__":
    main()
