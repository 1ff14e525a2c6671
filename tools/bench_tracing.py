#!/usr/bin/env python3
"""What tracing costs per request: pystub before tracing existed, with tracing off, and at rate=1.

Servers (all up for the whole run, measured in turn, rounds rotating the order, medians shown):

    baseline     a checkout of the commit given by --baseline (the code before tracing)
    off          this tree, no --trace-config (tracing off: the default)
    level-off    this tree, mode=opentelemetry with level OFF (exporter thread up, nothing sampled)
    rate=1       this tree, every request traced, spans exported to a collector on 127.0.0.1

Each point is N sequential HTTP requests to tests/models/bls_leaf (3 FP32 values) from one
keep-alive client; the figure is the mean latency of a request in microseconds.

    .venv/bin/python tools/bench_tracing.py --baseline 722102c --requests 1500 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.harness import Backend, make_repository  # noqa: E402
from tests.otlp_collector import Collector  # noqa: E402


def _checkout(commit: str, directory: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "pystub_backend"], check=True,
                             capture_output=True).stdout
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(directory)], input=archive, check=True)
    return directory


def _mean_us(backend: Backend, requests: int) -> float:
    client = httpclient.InferenceServerClient(backend.http_url)
    tensor = httpclient.InferInput("IN", [3], "FP32")
    tensor.set_data_from_numpy(np.arange(3, dtype=np.float32))
    try:
        for _ in range(50):  # warm up
            client.infer("bls_leaf", [tensor])
        started = time.perf_counter()
        for _ in range(requests):
            client.infer("bls_leaf", [tensor])
        return (time.perf_counter() - started) / requests * 1e6
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="commit before tracing")
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work, Collector() as collector:
        repository = make_repository(Path(work), "bls_leaf")
        baseline = _checkout(args.baseline, Path(work) / "baseline")
        otel = ("--trace-config", "mode=opentelemetry", "--trace-config", f"opentelemetry,url={collector.url}")
        servers = {
            # The harness runs `python -m` from this tree: the wrapper moves it into the checkout.
            "baseline": Backend(repository, wrapper=["sh", "-c", f'cd {baseline} && PYTHONPATH={baseline} exec "$@"',
                                                     "sh"]),
            "off": Backend(repository),
            "level-off": Backend(repository, *otel),
            "rate=1": Backend(repository, *otel, "--trace-config", "rate=1", "--trace-config", "level=TIMESTAMPS"),
        }
        try:
            for server in servers.values():
                server.start()
            figures: dict[str, list[float]] = {name: [] for name in servers}
            names = list(servers)
            for round_ in range(args.rounds):
                for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                    figures[name].append(_mean_us(servers[name], args.requests))
            print(f"{'server':<10} {'median us/request':>18}  rounds")
            for name, values in figures.items():
                print(f"{name:<10} {statistics.median(values):>18.1f}  {' '.join(f'{v:.0f}' for v in values)}")
            print(f"spans received by the collector: {len(collector.spans)}")
        finally:
            for server in servers.values():
                server.stop(check=False)


if __name__ == "__main__":
    main()
