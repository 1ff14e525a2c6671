"""perf_analyzer (C++ load generator, tritonclient 2.50.0 wheel) for the servers it can drive.

It reads the model configuration (`/v2/models/{m}/config`, gRPC ModelConfig), which MLServer does
not serve, so it runs against pystub and Triton only. Time-window mode (its request-count mode
misreports throughput); a stability band of 1000% makes it report after its first three windows
instead of retrying for a stable window that a shared 2-core machine rarely gives.

CPU per request: the server's (leader and descendants) and perf_analyzer's CPU over the whole run,
divided by the requests of the run (its throughput times the run's length). The run's start
(connecting, reading the model's metadata) counts in its length, so the figure is a slight
overestimate, the same for every server.
"""

from __future__ import annotations

import csv
import resource
import subprocess
import tempfile
import time
from pathlib import Path

from compare import cpu, stopping
from compare.environment import BenchEnv
from compare.loadgen import Point, Sample


def command(env: BenchEnv, url: str, point: Point, window_ms: int, csv_path: Path) -> list[str]:
    """The perf_analyzer command line for one point."""
    args = [str(env.perf_analyzer), "-m", point.model, "-u", url, "-i", "grpc" if point.protocol == "grpc" else "http",
            "--concurrency-range", str(point.concurrency), "--measurement-mode", "time_windows",
            "--measurement-interval", str(window_ms), "--stability-percentage", "1000", "--max-trials", "10",
            "-f", str(csv_path)]
    if point.model == "identity_fp32":
        args += ["-b", "1", "--shape", f"INPUT0:{max(1, point.nbytes // 4)}"]
    if point.shm:
        args += ["--shared-memory", "system", "--output-shared-memory-size", str(max(64, point.nbytes))]
    return args


def run_child(args: list[str], output: Path, timeout: float, environ: dict[str, str] | None = None,
              what: str = "perf_analyzer") -> int:
    """Run a load generator (`what`) to its end with its output into `output`; its exit status.
    Kills it on a stop request (StopRequested) or after `timeout` (RuntimeError). Its CPU time
    then counts in this process's RUSAGE_CHILDREN."""
    with open(output, "wb") as sink:
        process = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=environ)
    deadline = time.monotonic() + timeout
    try:
        while process.poll() is None:
            stopping.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} gave no result within {timeout:.0f} s")
            time.sleep(0.1)
        return process.returncode
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def measure(env: BenchEnv, url: str, server_pid: int, point: Point, window_ms: int) -> Sample:
    """Run perf_analyzer for one point against the server whose leader is `server_pid`; raises
    RuntimeError with its output when it fails."""
    with tempfile.TemporaryDirectory(prefix="pystub-bench-pa-") as tmp:
        csv_path = Path(tmp) / "result.csv"
        args = command(env, url, point, window_ms, csv_path)
        output = Path(tmp) / "output.txt"
        began, cpu0 = time.perf_counter(), cpu.now(server_pid, resource.RUSAGE_CHILDREN)
        returncode = run_child(args, output, 60 + 12 * window_ms / 1000, env.perf_analyzer_env())
        elapsed, cpu1 = time.perf_counter() - began, cpu.now(server_pid, resource.RUSAGE_CHILDREN)
        if returncode != 0 or not csv_path.exists():
            text = output.read_text(errors="replace").strip()[-400:]
            raise RuntimeError(f"perf_analyzer exit {returncode}: {text}")
        with open(csv_path, newline="") as handle:
            rows = list(csv.DictReader(handle))
    if not rows:
        raise RuntimeError("perf_analyzer wrote no measurement")
    row = rows[0]
    throughput = float(row["Inferences/Second"])
    per = cpu.per_request_us(cpu0, cpu1, throughput * elapsed)
    return Sample(throughput=throughput, p50_ms=float(row["p50 latency"]) / 1000,
                  p99_ms=float(row["p99 latency"]) / 1000, count=0,
                  cpu_server_us=per[0], cpu_children_us=per[1], cpu_client_us=per[2])
