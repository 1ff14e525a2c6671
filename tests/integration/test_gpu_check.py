"""tools/gpu_check.py where it can run: on this machine without a GPU it says so and exits 3,
checking nothing; and its harness (the repository it writes, pystub started on free ports, the
HTTP calls, BLS between two of its models) works on the models that need no PyTorch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from harness import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import gpu_check  # noqa: E402 - tools/ is not a package


def test_without_a_gpu_the_check_says_so_and_exits_non_zero() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py")], capture_output=True,
                            text=True, timeout=120, cwd=str(ROOT))
    assert result.returncode == gpu_check.NO_GPU_EXIT, result.stdout + result.stderr
    assert result.stdout.startswith("SKIP  no GPU: ") and "PASS" not in result.stdout


def test_the_checks_harness_serves_its_cpu_models(tmp_path: Path) -> None:
    repository = gpu_check.write_repository(tmp_path / "models", ("numpy_cpu", "bls_cpu"))  # no PyTorch here
    data = np.arange(1000, dtype=np.float32)
    with gpu_check.running_pystub(repository, tmp_path / "pystub.log") as ports:
        parameters: dict[str, object] = {}
        bls = gpu_check._http_infer(ports, "bls_cpu", data, parameters)
        direct = gpu_check._http_infer(ports, "numpy_cpu", data)
    np.testing.assert_array_equal(direct, data * 2 + 1)
    np.testing.assert_array_equal(bls, (data * 2 + 1) * 2 + 1)
    # the CPU callee's answers are CPU tensors, its inputs were CPU tensors, nothing mapped
    assert parameters == {"on_gpu": False, "inputs_on_gpu": False, "mapped": 0}
