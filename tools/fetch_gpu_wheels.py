#!/usr/bin/env python3
"""Fetch the wheels the GPU machine's image lacks into .whl/ (ignored by git), for the device check.

    python tools/fetch_gpu_wheels.py            # download (cp312, manylinux x86-64) and check the size
    python tools/fetch_gpu_wheels.py --verify   # ... then prove the set complete: install it with the
                                                # image's other packages into a Python 3.12 folder and
                                                # run `gpu_check.py --fake` there

The GPU machine (docs/gpu.md#the-device-check) has Python 3.12, PyTorch, cuda-bindings, nvidia-ml-py,
numpy, msgpack, aiohttp, psutil, prometheus-client, packaging, urllib3, ml-dtypes and no package
index. What pystub needs besides is CARRIED, pinned to the versions its tests run with, each
downloaded without its dependencies (they are in this list or on the image). The check installs
them with `pip install --no-index --no-deps --target` and runs. Everything that travels to that
machine, the working tree included, must stay under 64 MiB: the script fails when the wheels pass
their share (BUDGET_BYTES).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / ".whl"
BUDGET_BYTES = 40 << 20  # of the 64 MiB a device call carries; the working tree takes the rest

CARRIED = (
    "posix-ipc==1.3.2", "ngh2==0.3.0", "pysimdjson==7.0.2", "orjson==3.13.0", "python-rapidjson==1.25",
    "tritonclient==2.73.0", "grpcio==1.85.3", "grpcio-health-checking==1.81.1", "grpcio-reflection==1.81.1",
    "protobuf==6.33.6", "opentelemetry-proto==1.45.2",
)
# On the image already (KINDS.md's package list); --verify fetches them into a scratch folder only.
ON_THE_IMAGE = (
    "numpy==2.4.6", "msgpack==1.2.4", "psutil==7.2.2", "prometheus-client==0.26.0", "packaging==26.4",
    "urllib3==2.8.0", "ml-dtypes==0.5.4", "nvidia-ml-py==13.615.71", "aiohttp==3.14.5", "aiohappyeyeballs==2.7.1",
    "aiosignal==1.4.0", "attrs==26.1.0", "frozenlist==1.8.0", "multidict==7.2.1", "propcache==0.5.4", "yarl==1.25.1",
    "idna==3.20", "typing-extensions==4.16.0",
)
_PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35, 39)] + ["manylinux2014_x86_64",
                                                                                      "manylinux1_x86_64"]


def download(requirements: tuple[str, ...], destination: Path) -> None:
    """Each requirement's cp312 manylinux x86-64 wheel (or a pure one) into `destination`."""
    destination.mkdir(parents=True, exist_ok=True)
    platforms = [argument for platform in _PLATFORMS for argument in ("--platform", platform)]
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.12", "--implementation", "cp", *platforms, "-d", str(destination), *requirements]
    subprocess.run(command, check=True, timeout=600)


def _python312() -> list[str] | None:
    """A Python 3.12 interpreter here (the image's version), for --verify."""
    for command in (["python3.12"], ["env", "PYENV_VERSION=3.12.1", "python3.12"], ["uv", "run", "-p", "3.12",
                                                                                        "python"]):
        try:
            if subprocess.run([*command, "-c", "import sys; assert sys.version_info[:2] == (3, 12)"],
                              capture_output=True, timeout=120).returncode == 0:
                return command
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


def verify() -> int:
    """Install the carried wheels and the image's packages into one 3.12 folder; run the fake check."""
    python = _python312()
    if python is None:
        print("verify: no Python 3.12 here (python3.12, pyenv 3.12.1 or uv): not verified", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="pystub-wheels-") as scratch:
        image, site = Path(scratch) / "image", Path(scratch) / "site"
        download(ON_THE_IMAGE, image)
        wheels = sorted(glob.glob(str(WHEELS / "*.whl"))) + sorted(glob.glob(str(image / "*.whl")))
        subprocess.run([*python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target",
                        str(site), *wheels], check=True, timeout=600)
        environment = dict(os.environ, PYTHONPATH=str(site), GPU_CHECK_INSTALLED="1", PYTHONNOUSERSITE="1")
        result = subprocess.run([*python, str(ROOT / "tools" / "gpu_check.py"), "--fake", "--budget-s=200"],
                                env=environment, timeout=300, cwd=str(ROOT))
    print(f"verify: gpu_check.py --fake under Python 3.12 with only these wheels: exit {result.returncode}")
    return result.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verify", action="store_true", help="prove the set complete (needs a Python 3.12 here)")
    args = parser.parse_args()
    shutil.rmtree(WHEELS, ignore_errors=True)  # one version of each: two would stop the install
    download(CARRIED, WHEELS)
    total = sum(path.stat().st_size for path in WHEELS.glob("*.whl"))
    for path in sorted(WHEELS.glob("*.whl")):
        print(f"{path.stat().st_size / 2**20:7.2f} MiB  {path.name}")
    print(f"{total / 2**20:7.2f} MiB  in {WHEELS} (budget {BUDGET_BYTES >> 20} MiB)")
    if total > BUDGET_BYTES:
        print("too large for a device call: carry fewer wheels", file=sys.stderr)
        return 1
    return verify() if args.verify else 0


if __name__ == "__main__":
    sys.exit(main())
