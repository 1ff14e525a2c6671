"""Starting a real pystub-backend for a benchmark script: one place, so every tool does it alike."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["ROOT", "start_backend"]

ROOT = Path(__file__).resolve().parent.parent
_GRPC_PORT = re.compile(r"Started GRPCInferenceService at [\d.]+:(\d+)")


def start_backend(repository: Path, log_path: Path, *flags: str) -> tuple[subprocess.Popen, int]:
    """Start `python -m pystub_backend.backend` on ephemeral ports (its own session; the caller kills the group)
    and return it with its gRPC port. Exits with the log when it does not start within 90 s."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "pystub_backend.backend",
                                    "--model-repository", str(repository),
                                    "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", *flags],
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(ROOT),
                                   env=env, start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        match = _GRPC_PORT.search(log_path.read_text(errors="replace"))
        if match:
            return process, int(match.group(1))
        if process.poll() is not None:
            break
        time.sleep(0.05)
    process.kill()
    raise SystemExit(f"backend did not start:\n{log_path.read_text(errors='replace')}")
