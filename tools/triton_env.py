#!/usr/bin/env python3
"""Install real Triton 2.51 (with its Python backend) into `.bench/venv`, and only that.

The differential test tier (tests/differential) uses Triton as the oracle. It needs a subset of
what tools/compare/environment.py installs for the benchmark: `numpy<2` (the stub Triton bundles is
built against numpy 1.x) and the `nvidia-pytriton==0.5.13` wheel that carries tritonserver 2.51.0,
its Python backend and the stub (installed --no-deps: only its files are used). MLServer and
perf_analyzer are not installed here, which keeps a CI run's install to about a minute.

The install is recorded by its own stamp file, so the benchmark's `environment.ensure()` still
installs its extra peers on top of the same venv later. Locating the binaries and assembling the
backend directory is `environment._locate`, written once.

    .venv/bin/python tools/triton_env.py            # install if needed, print where things are (JSON)
    .venv/bin/python tools/triton_env.py --check    # exit 1 (with the reason) when not installed

Exit status: 0 when Triton is ready to start, 1 when it could not be installed (the reason on stderr).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import environment  # noqa: E402  (needs the path above)
from compare.environment import BENCH, PYTRITON, BenchEnv  # noqa: E402

TRITON_PACKAGES = ("numpy<2",)
_INSTALL_TIMEOUT = 1800


class TritonInstallError(RuntimeError):
    """Triton could not be installed or located; the message says which step and why."""


def _stamp(venv: Path) -> Path:
    text = "|".join((PYTRITON, *TRITON_PACKAGES, sys.version))
    return venv / f".installed-triton-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _run(command: list[str]) -> None:
    """Run one install step; raises TritonInstallError with the step's output when it fails."""
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT,
                                stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise TritonInstallError(f"install step {' '.join(command)} failed: {error}") from error
    if result.returncode != 0:
        raise TritonInstallError(f"install step failed: {' '.join(command)}\n"
                                 f"{result.stdout[-2000:]}{result.stderr[-2000:]}")


def ensure_triton(install: bool = True) -> BenchEnv:
    """Install Triton 2.51 into .bench/venv once, then locate its server, backend and stub.

    Raises TritonInstallError when an install step fails (e.g. no network) or when `install` is
    False and nothing is installed yet.
    """
    venv = BENCH / "venv"
    BENCH.mkdir(parents=True, exist_ok=True)
    # Test workers may call this at once: one installs, the others wait for it on the lock.
    with open(BENCH / ".triton-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _install(venv, install)
    try:
        return environment._locate(venv, venv / "bin" / "python")
    except (SystemExit, OSError, subprocess.SubprocessError) as error:
        raise TritonInstallError(f"Triton installed in {venv} cannot be used: {error}") from error


def _install(venv: Path, install: bool) -> None:
    python = venv / "bin" / "python"
    stamp = _stamp(venv)
    if not stamp.exists():
        if not install:
            raise TritonInstallError(f"Triton is not installed in {venv}: run tools/triton_env.py")
        print(f"[triton env] installing Triton 2.51 ({PYTRITON}) into {venv} (once)", file=sys.stderr, flush=True)
        if not python.exists():
            _run([sys.executable, "-m", "venv", str(venv)])
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        _run([*pip, *TRITON_PACKAGES])
        _run([*pip, "--no-deps", PYTRITON])
        stamp.touch()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="do not install; fail when not installed")
    args = parser.parse_args(argv)
    try:
        env = ensure_triton(install=not args.check)
    except TritonInstallError as error:
        print(f"[triton env] {error}", file=sys.stderr)
        return 1
    print(json.dumps({"tritonserver": str(env.tritonserver), "backends": str(env.triton_backends),
                      "python": str(env.python)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
