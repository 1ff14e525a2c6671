#!/usr/bin/env python3
"""Client shared memory benchmark: a 64 MiB identity over gRPC with its input and output in the
client's system shared memory, against the same request carrying the bytes in the gRPC messages,
measured in the same run against the same server.

    shm      tritonclient registers two regions (tritonclient.utils.shared_memory); each request
             names them: the stub maps the input region read-only, the model returns it, and the
             stub writes the output straight into the output region (one memcpy in all).
    grpc     the same request with the bytes in raw_input_contents / raw_output_contents: the client
             serializes 64 MiB, the backend copies it into the stub's arena, the output comes back
             through the s2p arena and the gRPC response.
    copy     one single-threaded numpy copy of the same bytes, for scale (the floor of `shm`).

The two kinds of requests alternate round by round, so both see the same machine load; times are
medians. Prints the table and the ratio, exits 0.

    tools/bench_client_shm.py               # 64 MiB, 10 rounds
    tools/bench_client_shm.py --quick       # 3 rounds
    tools/bench_client_shm.py --size 16M --rounds 20
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

import numpy as np  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.utils.shared_memory as shm  # noqa: E402

_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests]
'''
_CONFIG = '''name: "bench_shm_identity"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_UINT8, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_UINT8, dims: [ -1 ] } ]
'''
_MODEL_NAME = "bench_shm_identity"
_GRPC_PORT = re.compile(r"Started GRPCInferenceService at [\d.]+:(\d+)")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    digits, unit = text.rstrip("KMG"), text[len(text.rstrip("KMG")):]
    if not digits.isdigit() or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use e.g. 64M")
    return int(digits) * _UNITS[unit]


def fmt_time(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


class Server:
    """`pystub-backend --allow-client-shm=true` on a one-model repository, on an ephemeral port."""

    def __init__(self, directory: str) -> None:
        model = Path(directory) / "models" / _MODEL_NAME
        (model / "1").mkdir(parents=True)
        (model / "config.pbtxt").write_text(_CONFIG)
        (model / "1" / "model.py").write_text(_MODEL)
        self.log_path = Path(directory) / "server.log"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
        # 64 MiB arenas, so that the gRPC variant does not pay for growing them in every round.
        arena = ["--backend-config=python,shm-default-byte-size=134217728"]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pystub_backend.backend", "--model-repository", str(model.parent),
                 "--http-port", "0",
                 "--grpc-port", "0", "--metrics-port", "0", "--allow-client-shm=true", *arena],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(ROOT), env=env,
                start_new_session=True)
        self.url = f"127.0.0.1:{self._wait_for_port(60.0)}"

    def _wait_for_port(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = _GRPC_PORT.search(self.log_path.read_text(errors="replace"))
            if match:
                return int(match.group(1))
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"the server did not start:\n{self.log_path.read_text(errors='replace')}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


class Bench:
    def __init__(self, client: Any, size: int) -> None:
        self.client = client
        self.size = size
        self.data = (np.arange(size, dtype=np.uint64) % 251).astype(np.uint8)
        tag = f"{os.getpid()}"
        self.in_key, self.out_key = f"/bench_shm_in_{tag}", f"/bench_shm_out_{tag}"
        self.in_region = shm.create_shared_memory_region("bench_in", self.in_key, size, create_only=True)
        self.out_region = shm.create_shared_memory_region("bench_out", self.out_key, size, create_only=True)
        shm.set_shared_memory_region(self.in_region, [self.data])
        client.register_system_shared_memory("bench_in", self.in_key, size)
        client.register_system_shared_memory("bench_out", self.out_key, size)
        self.shm_inputs = [grpcclient.InferInput("INPUT0", [size], "UINT8")]
        self.shm_inputs[0].set_shared_memory("bench_in", size)
        self.shm_outputs = [grpcclient.InferRequestedOutput("OUTPUT0")]
        self.shm_outputs[0].set_shared_memory("bench_out", size)

    def shm_round(self) -> int:
        start = time.perf_counter_ns()
        self.client.infer(_MODEL_NAME, self.shm_inputs, outputs=self.shm_outputs)
        output = shm.get_contents_as_numpy(self.out_region, np.uint8, [self.size])
        elapsed = time.perf_counter_ns() - start
        self._check(output)
        return elapsed

    def grpc_round(self) -> int:
        start = time.perf_counter_ns()
        inputs = [grpcclient.InferInput("INPUT0", [self.size], "UINT8")]
        inputs[0].set_data_from_numpy(self.data)
        result = self.client.infer(_MODEL_NAME, inputs)
        output = result.as_numpy("OUTPUT0")
        elapsed = time.perf_counter_ns() - start
        self._check(output)
        return elapsed

    def _check(self, output: np.ndarray) -> None:
        middle = self.size // 2
        if output.size != self.size or output[-1] != self.data[-1] or output[middle] != self.data[middle]:
            raise RuntimeError("the identity returned different bytes")

    def close(self) -> None:
        try:
            self.client.unregister_system_shared_memory()
        finally:
            shm.destroy_shared_memory_region(self.in_region)
            shm.destroy_shared_memory_region(self.out_region)


def numpy_copy_seconds(size: int, rounds: int) -> float:
    source = np.ones(size, dtype=np.uint8)
    target = np.empty_like(source)
    np.copyto(target, source)
    samples = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        np.copyto(target, source)
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) / 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, default=64 << 20, help="payload size (default 64M)")
    parser.add_argument("--rounds", type=int, help="rounds of each kind (default 10, --quick 3)")
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args(argv)
    rounds = options.rounds or (3 if options.quick else 10)
    size = options.size
    with tempfile.TemporaryDirectory(prefix="pystub-bench-shm-") as directory:
        server = Server(directory)
        try:
            client = grpcclient.InferenceServerClient(server.url)
            bench = Bench(client, size)
            try:
                bench.shm_round(), bench.grpc_round()  # warm-up: map the regions, grow nothing later
                shm_samples, grpc_samples = [], []
                for _ in range(rounds):
                    shm_samples.append(bench.shm_round())
                    grpc_samples.append(bench.grpc_round())
            finally:
                bench.close()
                client.close()
        finally:
            server.stop()
    shm_time = statistics.median(shm_samples) / 1e9
    grpc_time = statistics.median(grpc_samples) / 1e9
    copy_time = numpy_copy_seconds(size, rounds)
    mib = size / (1 << 20)
    print(f"identity of {mib:g} MiB over gRPC, {rounds} rounds each, medians "
          f"(bandwidth counts each direction's bytes once)\n")
    header = f"{'variant':<34} {'round trip':>11} {'bandwidth':>11}"
    print(header)
    print("-" * len(header))
    for label, seconds in (("client shm (input+output in regions)", shm_time),
                           ("gRPC messages (raw contents)", grpc_time)):
        print(f"{label:<34} {fmt_time(seconds):>11} {2 * size / seconds / 1e9:>6.2f} GB/s")
    print(f"{'numpy copy of the bytes (scale)':<34} {fmt_time(copy_time):>11} {size / copy_time / 1e9:>6.2f} GB/s")
    print(f"\nclient shm is {grpc_time / shm_time:.1f}x faster than the same request without shm "
          f"(and takes {shm_time / copy_time:.1f}x one numpy copy of the bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
