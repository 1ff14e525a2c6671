#!/usr/bin/env python3
"""BLS benchmark: the cost of a BLS call against the same request sent directly by a client, in
one run, for a small tensor and a 16 MiB one.

    direct   a tritonclient gRPC client calls `leaf` (OUT = IN) N times in a row
    BLS      a model's `execute` calls `leaf` with the same tensor N times in a row
             (pb_utils.InferenceRequest(...).exec()), timing itself

Both paths cross the same server: the direct call goes client → gRPC → backend → leaf's stub →
backend → client; the BLS call goes caller's stub (s2p arena) → backend → leaf's stub → backend
→ caller's p2s arena. Printed: mean time per call of each, the ratio BLS/direct, and memcpy of
the tensor in this process as a yardstick. The two are measured in alternating rounds and each
one's median round is kept (a shared machine's load changes during a run). Exits 0 whatever
the numbers.

    tools/bench_bls.py
    tools/bench_bls.py --small-calls 1000 --large-calls 50 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_backend import start_backend  # noqa: E402 - after the path is set

MIB = 1 << 20

LEAF = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                            .as_numpy())]) for r in requests]
'''

CALLER = '''
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            count = json.loads(request.parameters())["count"]
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            call = pb_utils.InferenceRequest(model_name="leaf", inputs=[pb_utils.Tensor("IN", data)],
                                             requested_output_names=["OUT"])
            for _ in range(2):  # warm-up: arenas grow to size once
                call.exec()
            started = time.perf_counter()
            for _ in range(count):
                response = call.exec()
                if response.has_error():
                    raise RuntimeError(response.error().message())
                del response
            per_call = (time.perf_counter() - started) / count
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SECONDS", np.array([per_call]))]))
        return responses
'''

CONFIG = '''
backend: "python"
max_batch_size: 0
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }} ]
output [ {{ name: "{output}", data_type: {dtype}, dims: [ -1 ] }} ]
'''



def write_repository(root: Path) -> None:
    for name, source, output, dtype in (("leaf", LEAF, "OUT", "TYPE_FP32"), ("caller", CALLER, "SECONDS", "TYPE_FP64")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(source)
        (root / name / "config.pbtxt").write_text(CONFIG.format(output=output, dtype=dtype))


def tensor(data: np.ndarray) -> grpcclient.InferInput:
    value = grpcclient.InferInput("IN", [data.size], "FP32")
    value.set_data_from_numpy(data)
    return value


def direct(client: grpcclient.InferenceServerClient, data: np.ndarray, count: int) -> float:
    for _ in range(2):
        client.infer("leaf", [tensor(data)])
    started = time.perf_counter()
    for _ in range(count):
        client.infer("leaf", [tensor(data)])
    return (time.perf_counter() - started) / count


def bls(client: grpcclient.InferenceServerClient, data: np.ndarray, count: int) -> float:
    result = client.infer("caller", [tensor(data)], parameters={"count": count}, client_timeout=600)
    return float(result.as_numpy("SECONDS")[0])


def memcpy(data: np.ndarray, count: int = 20) -> float:
    target = np.empty_like(data)
    started = time.perf_counter()
    for _ in range(count):
        np.copyto(target, data)
    return (time.perf_counter() - started) / count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small-calls", type=int, default=500)
    parser.add_argument("--large-calls", type=int, default=25)
    parser.add_argument("--small-elements", type=int, default=16, help="FP32 elements of the small tensor")
    parser.add_argument("--large-mib", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per size (median kept)")
    args = parser.parse_args()
    sizes = [("small", np.arange(args.small_elements, dtype=np.float32), args.small_calls),
             ("16 MiB" if args.large_mib == 16 else f"{args.large_mib} MiB",
              np.random.default_rng(0).random(args.large_mib * MIB // 4, dtype=np.float32), args.large_calls)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="pystub-bench-bls-") as tmp:
        repository = Path(tmp) / "models"
        write_repository(repository)
        process, port = start_backend(repository, Path(tmp) / "backend.log",
                                      "--backend-config=python,stub-timeout-seconds=120")
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            for label, data, count in sizes:
                # Alternate the two in rounds and keep each one's median round: the machine's load
                # changes during a run, and both should see the same conditions.
                per_round = max(1, count // args.rounds)
                directs, blss = [], []
                for _ in range(args.rounds):
                    directs.append(direct(client, data, per_round))
                    blss.append(bls(client, data, per_round))
                rows.append((label, data.nbytes, per_round * args.rounds, statistics.median(directs),
                             statistics.median(blss), memcpy(data)))
        finally:
            client.close()
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
    print("mean time per call; the same request to the same model (`leaf`, OUT = IN)")
    print(f"{'tensor':>8} {'bytes':>10} {'calls':>6} {'direct ms':>10} {'BLS ms':>8} {'BLS/direct':>11} "
          f"{'memcpy ms':>10}")
    for label, nbytes, count, direct_s, bls_s, copy_s in rows:
        print(f"{label:>8} {nbytes:>10} {count:>6} {direct_s * 1e3:10.3f} {bls_s * 1e3:8.3f} {bls_s / direct_s:10.2f}x "
              f"{copy_s * 1e3:10.3f}")
    print(json.dumps({label: round(bls_s / direct_s, 3) for label, _, _, direct_s, bls_s, _ in rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
