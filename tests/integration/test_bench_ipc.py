"""tools/bench_ipc.py runs from a checkout and reports; a tiny run keeps it from rotting."""

from __future__ import annotations

import subprocess
import sys

from harness import ROOT


def test_bench_ipc_smoke() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_ipc.py"), "--sizes", "16,64K", "--rounds", "5"],
                         capture_output=True, text=True, timeout=100, cwd="/")
    assert run.returncode == 0, run.stderr
    assert "64 KiB" in run.stdout and "Targets:" in run.stdout, run.stdout
    assert "WARNING" not in run.stderr, run.stderr  # e.g. request inputs left in the p2s arena
