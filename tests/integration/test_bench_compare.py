"""tools/bench_compare.py, pystub side only: it starts a server, measures, prints the table, cleans up.

The full comparison (Triton, MLServer, perf_analyzer) installs peers into .bench/ and runs for
most of an hour: a documented manual command (docs/comparing.md#comparing-with-triton-and-mlserver), not
a CI test. This one downloads nothing.
"""

from __future__ import annotations

import re
import subprocess
import sys

import psutil
from harness import ROOT


def test_bench_compare_pystub_only() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_compare.py"), "--quick", "--servers", "pystub",
                          "--loadgen", "asyncio", "--models", "identity_fp32", "--sizes", "16", "--concurrency", "2",
                          "--seconds", "0.5", "--warmup", "0.2", "--protocols", "grpc,http", "--ceilings", "none"],
                         capture_output=True, text=True, timeout=90, cwd="/")
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line for line in run.stdout.splitlines() if line.startswith("identity_fp32")]
    plain = [line for line in rows if " yes " not in line]
    assert len(plain) == 2, run.stdout  # 16 B x concurrency 2 x grpc, http
    for line in plain:
        throughput = float(line.split("|")[1].split()[0])
        assert throughput > 0, line
    assert "Targets" in run.stdout and "health/metadata p99" in run.stdout, run.stdout
    # the server it started is gone, whatever the bench printed
    pids = [int(pid) for pid in re.findall(r"started pystub pid (\d+)", run.stderr)]
    assert pids, run.stderr[-2000:]
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)


def test_bench_compare_json_rows_and_bare_ceilings() -> None:
    """JSON-tensor rows and two bare-frontend ceilings beside pystub; every process gone after."""
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_compare.py"), "--quick", "--servers", "pystub",
                          "--loadgen", "asyncio", "--models", "identity_fp32", "--sizes", "16", "--concurrency", "2",
                          "--seconds", "0.5", "--warmup", "0.2", "--no-shm", "--no-probe",
                          "--ceilings", "bare-http,bare-grpc-sync"],
                         capture_output=True, text=True, timeout=90, cwd="/")
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {line.split("|")[0].split()[-1]: line.split("|") for line in run.stdout.splitlines()
            if line.startswith("identity_fp32")}
    assert set(rows) == {"grpc", "http", "json"}, run.stdout
    # columns: pystub, bare-http, bare-grpc-sync; a bare server serves only its own protocol
    for proto, cells in rows.items():
        assert float(cells[1].split()[0]) > 0, cells
        bare_http, bare_grpc = cells[2].split()[0], cells[3].split()[0]
        served, idle = (bare_grpc, bare_http) if proto == "grpc" else (bare_http, bare_grpc)
        assert idle == "-" and float(served) > 0, cells
    pids = [int(pid) for pid in re.findall(r"started \S+ pid (\d+)", run.stderr)]
    assert len(pids) == 3, run.stderr[-2000:]
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)
