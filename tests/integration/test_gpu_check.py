"""tools/gpu_check.py where it can run: on this machine without a GPU it says so and exits 3,
checking nothing; with --fake it runs every case end to end on pystub's fake GPU (the same models,
with the fake device in place of PyTorch) and every line is a PASS, a LATENCY row or the summary."""

from __future__ import annotations

import subprocess
import sys

from harness import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import gpu_check  # noqa: E402 - tools/ is not a package


def test_without_a_gpu_the_check_says_so_and_exits_non_zero() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py")], capture_output=True,
                            text=True, timeout=120, cwd=str(ROOT))
    assert result.returncode == gpu_check.NO_GPU_EXIT, result.stdout + result.stderr
    assert result.stdout.startswith("SKIP  no GPU: ") and "PASS" not in result.stdout


def test_on_the_fake_gpu_every_case_passes_and_nothing_prints_a_traceback() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--fake", "--budget-s=100"],
                            capture_output=True, text=True, timeout=110, cwd=str(ROOT))
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert lines[0].startswith("START pystub ready") and lines[-1].startswith("DONE") and "all passed" in lines[-1]
    verdicts = [line for line in lines[1:-1] if not line.startswith("LATENCY")]
    assert len(verdicts) == len(gpu_check.CASES) and all(line.startswith("PASS  ") for line in verdicts), lines
    assert sum(line.startswith("LATENCY  ") for line in lines) == 2
