#!/usr/bin/env python3
"""Model multiplexing benchmark: the sub-model cache hit rate of routing against random routing.

One backend serves two copies of the multiplexing test model (tests/models/multiplex: 3 instances,
MAX_MULTIPLEXED_MODELS=2, each load sleeps LOAD_DELAY_MS):

    routed    MULTIPLEX_ROUTING affinity (default): work goes to instances that hold its id
    random    MULTIPLEX_ROUTING random: each request pinned to a random instance (the baseline)

The same skewed workload (N ids with weights 1/rank^s, a fixed seed per round) is sent to each in
turn by C concurrent gRPC clients; the model answers HIT per request. Printed per round: hit
rates, requests per instance, wall time; then the mean hit-rate ratio (target >= 2x). Exits 0
whether the target is met or not.

    tools/bench_multiplex.py
    tools/bench_multiplex.py --requests 500 --clients 6 --ids 10 --zipf 0.8 --rounds 3 --load-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
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
from bench_backend import ROOT, start_backend  # noqa: E402 - after the path is set

SOURCE = ROOT / "tests" / "models" / "multiplex"


def write_repository(root: Path, load_ms: int) -> None:
    for name, routing in (("routed", "affinity"), ("random", "random")):
        shutil.copytree(SOURCE, root / name)
        config = (root / name / "config.pbtxt").read_text()
        config = re.sub(r'"LOAD_DELAY_MS" value: \{ string_value: "\d+" \}',
                        f'"LOAD_DELAY_MS" value: {{ string_value: "{load_ms}" }}', config)
        config += f'parameters {{ key: "MULTIPLEX_ROUTING" value: {{ string_value: "{routing}" }} }}\n'
        (root / name / "config.pbtxt").write_text(config)


def workload(count: int, ids: int, zipf: float, seed: int) -> list[str]:
    rng = random.Random(seed)
    names = [f"m{rank}" for rank in range(ids)]
    return rng.choices(names, weights=[1 / (rank + 1) ** zipf for rank in range(ids)], k=count)


async def drive(url: str, model: str, ids: list[str], clients: int) -> dict[str, Any]:
    client = grpcclient.InferenceServerClient(url)
    pending = iter(ids)
    hits = 0
    served: dict[str, int] = {}

    async def worker() -> None:
        nonlocal hits
        for model_id in pending:
            tensor = grpcclient.InferInput("INPUT0", [2], "FP32")
            tensor.set_data_from_numpy(np.array([1, 2], np.float32))
            result = await client.infer(model, [tensor], parameters={"multiplexed_model_id": model_id})
            hits += int(result.as_numpy("HIT")[0])
            instance = result.as_numpy("INSTANCE")[0].decode()
            served[instance] = served.get(instance, 0) + 1

    try:
        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        elapsed = time.perf_counter() - began
    finally:
        await client.close()
    return {"hit_rate": hits / len(ids), "served": dict(sorted(served.items())), "seconds": elapsed}


async def run(args: argparse.Namespace, port: int) -> None:
    url = f"127.0.0.1:{port}"
    ratios = []
    for round_ in range(args.rounds):
        ids = workload(args.requests, args.ids, args.zipf, seed=round_)
        routed = await drive(url, "routed", ids, args.clients)
        randomly = await drive(url, "random", ids, args.clients)
        ratio = routed["hit_rate"] / max(randomly["hit_rate"], 1e-9)
        ratios.append(ratio)
        for name, outcome in (("routed", routed), ("random", randomly)):
            print(f"round {round_}  {name:6}  hit rate {outcome['hit_rate']:.3f}  {outcome['seconds']:5.2f} s  "
                  f"per instance {list(outcome['served'].values())}")
        print(f"round {round_}  ratio   {ratio:.2f}")
    print(f"\nhit rate routed / random: mean {statistics.mean(ratios):.2f}, min {min(ratios):.2f} "
          f"(target >= 2x; {args.ids} ids, Zipf s={args.zipf}, {args.requests} requests, {args.clients} clients)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--ids", type=int, default=10)
    parser.add_argument("--zipf", type=float, default=0.8, help="skew: weight of rank r is 1/r^s")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--load-ms", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-multiplex-") as directory:
        repository = Path(directory) / "models"
        write_repository(repository, args.load_ms)
        process, port = start_backend(repository, Path(directory) / "backend.log")
        try:
            asyncio.run(run(args, port))
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
