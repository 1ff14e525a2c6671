"""tools/bench_client_shm.py runs from a checkout and reports; a tiny run keeps it from rotting."""

from __future__ import annotations

import subprocess
import sys

from harness import ROOT


def test_bench_client_shm_smoke() -> None:
    command = [sys.executable, str(ROOT / "tools" / "bench_client_shm.py"), "--size", "64K", "--rounds", "2"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd="/")
    assert run.returncode == 0, run.stderr
    assert "client shm is" in run.stdout and "faster than the same request without shm" in run.stdout, run.stdout
