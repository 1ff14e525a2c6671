"""The two servers of the differential tier: real Triton 2.51 (the oracle) and pystub, one model repository.

Both are started with the same flags that matter (`--model-control-mode=explicit`, the same
`--load-model` list, loopback addresses, free ports), on private copies of
tests/differential/models so that neither sees the other's `__pycache__`. Triton comes from
`.bench/venv` (tools/triton_env.py installs it; ./dev.sh runs that before the tests). When it
cannot be installed the tier fails under CI=true and skips, with the reason, elsewhere.

Each server runs in its own process group; `stop()` sends SIGTERM, waits, SIGKILLs the group's
leftovers and removes the /dev/shm segments that carry Triton's prefix (pystub's own stop checks
that it left none). The processes are registered as long-lived so that the per-test leak check
of tests/conftest.py ignores them while they are shared.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness import LONG_LIVED_PIDS, ROOT, Backend, module_backend

MODELS = Path(__file__).resolve().parent / "models"
# Loaded at start-up by both servers; `loadable` and `init_fails` wait for the repository API.
STARTUP_MODELS = ("add_sub", "batched", "bytes_echo", "bf16_echo", "dyn_batch", "repeat", "bls_caller",
                  "bls_stream", "seq_acc", "params_echo", "counter", "controller", "raiser", "gen", "gen_stream",
                  "pb_args", "send_twice", "metric_maker")


def control_flags(models: Sequence[str]) -> tuple[str, ...]:
    """Both servers' model control: explicit, with `models` loaded at start-up."""
    return ("--model-control-mode=explicit", *(f"--load-model={name}" for name in models))


COMMON_FLAGS = control_flags(STARTUP_MODELS)
_START_TIMEOUT = 120.0
_STOP_TIMEOUT = 30.0

sys.path.insert(0, str(ROOT / "tools"))
from compare.environment import BenchEnv  # noqa: E402  (tools/ is not a package)
from triton_env import TritonInstallError, ensure_triton  # noqa: E402


@dataclass
class Endpoint:
    """Where one server listens."""

    name: str
    http_port: int
    grpc_port: int
    metrics_port: int

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"


@dataclass
class Pair:
    """Triton and pystub serving the same repository."""

    triton: Endpoint
    pystub: Endpoint
    pystub_backend: Backend
    triton_server: TritonServer


def copy_models(directory: Path) -> Path:
    repository = directory / "models"
    shutil.copytree(MODELS, repository, ignore=shutil.ignore_patterns("__pycache__"))
    return repository


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def triton_or_skip() -> BenchEnv:
    """The installed Triton environment; fails under CI=true, skips elsewhere, when it cannot be had.

    ./dev.sh has already tried to install it: when that failed, DIFFERENTIAL_TRITON_ERROR holds why
    and no second attempt is made here."""
    try:
        earlier = os.environ.get("DIFFERENTIAL_TRITON_ERROR")
        if earlier:
            raise TritonInstallError(earlier)
        return ensure_triton(install=True)
    except TritonInstallError as error:
        reason = f"real Triton 2.51 (the oracle) is not available: {error}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


class TritonServer:
    """tritonserver on free loopback ports, in its own process group."""

    def __init__(self, repository: Path, workdir: Path, flags: Sequence[str] = COMMON_FLAGS,
                 environment: Mapping[str, str] | None = None) -> None:
        self.env = triton_or_skip()
        self.environment = dict(environment or {})  # besides the bench's (a test hook's variables)
        self.repository = repository
        self.flags = tuple(flags)
        self.log_path = workdir / "triton.log"
        self.prefix = f"difftriton_{os.getpid()}_{int(time.time() * 1000) % 100000}_"
        self.process: subprocess.Popen[bytes] | None = None
        http, grpc, metrics = _free_ports(3)
        self.endpoint = Endpoint("triton", http, grpc, metrics)

    def start(self) -> Endpoint:
        self.launch()
        self.wait_ready()
        return self.endpoint

    def launch(self) -> None:
        """Start tritonserver without waiting for it (wait_ready waits)."""
        env = self.env
        command = [str(env.tritonserver), f"--model-repository={self.repository}",
                   f"--backend-directory={env.triton_backends}",
                   f"--http-port={self.endpoint.http_port}", f"--grpc-port={self.endpoint.grpc_port}",
                   f"--metrics-port={self.endpoint.metrics_port}", "--http-address=127.0.0.1",
                   "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1", "--exit-timeout-secs=5",
                   f"--backend-config=python,shm-region-prefix-name={self.prefix}", *self.flags]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            cwd=str(self.log_path.parent), env={**env.triton_env(), **self.environment},
                                            start_new_session=True)
        LONG_LIVED_PIDS.add(self.process.pid)

    def died(self, within: float = 0.0) -> str | None:
        """None while Triton runs (after waiting up to `within` s for it to exit); else its exit
        status and the tail of its log."""
        if self.process is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(within)
        if self.process.poll() is None:
            return None
        return f"tritonserver exited with {self.process.returncode}:\n{self.log_tail()}"

    def restart(self) -> None:
        """Stop what is left of Triton and start it again on the same ports (the endpoint stays valid)."""
        self.stop()
        self.process = None
        self.start()

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self) -> None:
        """Raises RuntimeError with the log tail when Triton exits or is not ready in time."""
        assert self.process is not None
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                url = f"http://{self.endpoint.http_url}/v2/health/ready"
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"tritonserver not ready after {_START_TIMEOUT:.0f} s (waiting for /v2/health/ready):\n"
                           f"{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM, wait, SIGKILL the group's leftovers, remove Triton's /dev/shm segments."""
        if self.process is None:
            return
        if self.process.poll() is not None:   # it died while serving: say so, with its last words
            print(f"tritonserver had exited with {self.process.returncode} before the tier ended:\n"
                  f"{self.log_tail()}", file=sys.stderr)
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            print(f"tritonserver did not stop in {_STOP_TIMEOUT:.0f} s: killing it", file=sys.stderr)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)
        for entry in Path("/dev/shm").glob(f"{self.prefix}*"):
            with contextlib.suppress(OSError):
                entry.unlink()
        LONG_LIVED_PIDS.discard(self.process.pid)


# The pystub variants every differential test runs against: {test id part: pystub's extra flags}.
PYSTUB_VARIANTS: dict[str, tuple[str, ...]] = {"single-process": (), "frontend-workers-2": ("--frontend-workers=2",)}


def without_variant(name: str) -> str:
    """A test's name without the pystub variant's id: what known.py and deviations.py are keyed by."""
    for variant in PYSTUB_VARIANTS:
        for part, rest in ((f"[{variant}]", ""), (f"[{variant}-", "["), (f"-{variant}]", "]"), (f"-{variant}-", "-")):
            name = name.replace(part, rest)
    return name


@contextlib.contextmanager
def running_pair(models: Sequence[str], *pystub_flags: str, both_flags: Sequence[str] = (),
                 environment: Mapping[str, str] | None = None,
                 repository: Callable[[Path], Path] = copy_models) -> Iterator[Pair]:
    """Start Triton and pystub (with `pystub_flags` besides the common ones, and `both_flags` and
    the variables of `environment` given to both) on copies of the repository (`repository(dir)`
    makes each server's), with `models` loaded; stop both at the end."""
    workdir = Path(tempfile.mkdtemp(prefix="differential-"))
    try:
        flags = (*control_flags(models), *both_flags)
        triton = TritonServer(repository(workdir / "triton"), workdir, flags, environment)
        backend = Backend(repository(workdir / "pystub"), *flags, "--allow-client-shm=true", *pystub_flags,
                          env=dict(environment or {}))
        try:
            triton.launch()   # both load their models at once: the pair is up in the slower one's time
            with module_backend(backend):
                triton.wait_ready()
                triton_endpoint = triton.endpoint
                pystub = Endpoint("pystub", backend.ports["http"], backend.ports["grpc"], backend.ports["metrics"])
                yield Pair(triton_endpoint, pystub, backend, triton)
        finally:
            triton.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
