#!/usr/bin/env python3
"""Dynamic batching benchmark: the same model with and without `dynamic_batching`, in one run.

The model has a fixed cost per call: it is written with `execute_batch` (pystub extension), so
each call does one small matrix product over all of its rows plus a sleep (default 2 ms).

    plain     no dynamic_batching: one request per call (DefaultScheduler, pipelined)
    batched   dynamic_batching { max_queue_delay_microseconds: D, preferred_batch_size: [C] }

One backend serves both models; an asyncio gRPC client (tritonclient.grpc.aio) keeps C requests
in flight (default 32) against each model in turn for a fixed time after a warm-up. Printed:
throughput, p50/p99 latency, the mean execute time of a batched call (from the statistics
extension), the throughput ratio (target >= 5x) and the latency budget (p99 <= delay + one
execute). Exits 0 whether the targets are met or not.

    tools/bench_batching.py
    tools/bench_batching.py --concurrency 32 --seconds 5 --delay-us 2000 --sleep-ms 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
import tritonclient.grpc.aio as grpcclient  # noqa: E402
from bench_backend import start_backend  # noqa: E402 - after the path is set

WIDTH = 64

MODEL = f'''
import time

import numpy as np


class TritonPythonModel:
    def initialize(self, args):
        import json
        parameters = json.loads(args["model_config"])["parameters"]
        self.sleep = float(parameters["SLEEP_MS"]["string_value"]) / 1000
        self.weights = np.random.default_rng(0).standard_normal(({WIDTH}, {WIDTH})).astype(np.float32)

    def execute_batch(self, inputs):
        out = inputs["INPUT0"] @ self.weights
        time.sleep(self.sleep)
        return {{"OUTPUT0": out}}
'''

CONFIG = '''
backend: "python"
max_batch_size: {max_batch}
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ {width} ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ {width} ] }} ]
parameters {{ key: "SLEEP_MS" value: {{ string_value: "{sleep_ms}" }} }}
{batching}
'''



def write_repository(root: Path, args: argparse.Namespace) -> None:
    batching = (f"dynamic_batching {{ max_queue_delay_microseconds: {args.delay_us} "
                f"preferred_batch_size: [ {args.max_batch} ] }}")
    for name, extra in (("plain", ""), ("batched", batching)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(MODEL)
        (root / name / "config.pbtxt").write_text(CONFIG.format(max_batch=args.max_batch, width=WIDTH,
                                                                sleep_ms=args.sleep_ms, batching=extra))


async def drive(url: str, model: str, concurrency: int, warmup: float, seconds: float) -> dict[str, Any]:
    client = grpcclient.InferenceServerClient(url)
    data = np.random.default_rng(1).standard_normal((1, WIDTH)).astype(np.float32)
    latencies: list[float] = []
    measuring = False
    stop_at = 0.0

    async def worker() -> None:
        while time.monotonic() < stop_at:
            tensor = grpcclient.InferInput("INPUT0", [1, WIDTH], "FP32")
            tensor.set_data_from_numpy(data)
            started = time.perf_counter()
            await client.infer(model, [tensor])
            if measuring:
                latencies.append(time.perf_counter() - started)

    try:
        stop_at = time.monotonic() + warmup + seconds
        tasks = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
        await asyncio.sleep(warmup)
        measuring, began = True, time.perf_counter()
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - began
        stats = (await client.get_inference_statistics(model, as_json=True))["model_stats"][0]
    finally:
        await client.close()
    latencies.sort()
    return {
        "throughput": len(latencies) / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "stats": stats,
    }


def server_summary(stats: dict[str, Any]) -> tuple[float, float, float, float]:
    """From the statistics extension: mean batch size, mean execute ms per call, and per request
    the mean queue wait and the mean time in the server (ms)."""
    executions = int(stats.get("execution_count", 0)) or 1
    inferences = int(stats.get("inference_count", 0))
    infer_ns = sum(int(b["compute_infer"]["ns"]) for b in stats.get("batch_stats", []))
    inference = stats["inference_stats"]

    def mean_ms(key: str) -> float:
        return int(inference[key]["ns"]) / max(1, int(inference[key]["count"])) / 1e6

    return inferences / executions, infer_ns / executions / 1e6, mean_ms("queue"), mean_ms("success")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--sleep-ms", type=float, default=2.0, help="fixed cost per execute call")
    parser.add_argument("--delay-us", type=int, default=2000, help="max_queue_delay_microseconds")
    parser.add_argument("--max-batch", type=int, default=32, help="max_batch_size and preferred size")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="pystub-bench-batching-") as tmp:
        repository = Path(tmp) / "models"
        write_repository(repository, args)
        process, port = start_backend(repository, Path(tmp) / "backend.log")
        try:
            results = {model: asyncio.run(drive(f"127.0.0.1:{port}", model, args.concurrency, args.warmup,
                                                args.seconds))
                       for model in ("plain", "batched")}
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)

    print(f"model: {WIDTH}x{WIDTH} matmul + {args.sleep_ms:g} ms sleep per call; concurrency {args.concurrency}, "
          f"{args.seconds:g} s per model; max_queue_delay {args.delay_us} us, max/preferred batch {args.max_batch}")
    print("client side: infer/s, p50, p99; server side (statistics): mean batch size, mean execute per call,")
    print("mean queue wait and mean time in the server per request")
    print(f"{'':8} {'infer/s':>8} {'p50 ms':>7} {'p99 ms':>7} | {'batch':>6} {'exec ms':>7} {'queue ms':>8} "
          f"{'server ms':>9}")
    for model, result in results.items():
        size, execute_ms, queue_ms, server_ms = server_summary(result["stats"])
        print(f"{model:8} {result['throughput']:8.0f} {result['p50_ms']:7.2f} {result['p99_ms']:7.2f} | "
              f"{size:6.1f} {execute_ms:7.2f} {queue_ms:8.2f} {server_ms:9.2f}")
    ratio = results["batched"]["throughput"] / results["plain"]["throughput"]
    _, execute_ms, queue_ms, _ = server_summary(results["batched"]["stats"])
    budget = args.delay_us / 1000 + execute_ms
    p99 = results["batched"]["p99_ms"]
    print(f"throughput ratio batched/plain: {ratio:.1f}x (target >= 5x: {'met' if ratio >= 5 else 'NOT met'})")
    print(f"latency budget max_queue_delay + one execute = {budget:.2f} ms: batched client p99 {p99:.2f} ms "
          f"({'met' if p99 <= budget else 'NOT met'}), mean queue wait {queue_ms:.2f} ms "
          f"({'met' if queue_ms <= budget else 'NOT met'}); plain p99 {results['plain']['p99_ms']:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
