"""Start and stop the three servers on loopback, each with the same two models and one instance.

    pystub    sys.executable -m pystub_backend.backend        examples/models/{identity_fp32,add_sub} as they are
    triton    .bench/.../tritonserver          the same model directories (model.py + config.pbtxt)
    mlserver  .bench/venv/bin/mlserver start   mlserver_runtime.Identity / AddSub, parallel_workers 1
    floor     tools/floor/serve.py             the request path's pure-Python floor: identity_fp32 only

Every server runs in its own session (process group). `stop()` asks the leader to shut down
(SIGTERM), waits, then SIGKILLs whatever is left in the group and removes the shared-memory
segments that carry the server's prefix, so nothing outlives the harness.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from compare.environment import ROOT, BenchEnv

MODELS = ("identity_fp32", "add_sub")
_START_TIMEOUT = 180.0
_STOP_TIMEOUT = 60.0


@dataclass
class Server:
    """A running server and where to reach it."""

    name: str
    process: subprocess.Popen
    http_port: int
    grpc_port: int
    log_path: Path
    shm_prefixes: list[str] = field(default_factory=list)
    extensions: list[str] = field(default_factory=list)
    models: tuple[str, ...] = MODELS  # whose readiness start-up waits for

    def url(self, protocol: str) -> str:
        return f"127.0.0.1:{self.grpc_port if protocol == 'grpc' else self.http_port}"

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports that were free a moment ago."""
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


def write_repositories(workdir: Path) -> dict[str, Path]:
    """One repository for pystub and Triton (the example model files) and one for MLServer."""
    models = workdir / "models"
    for name in MODELS:
        shutil.copytree(ROOT / "examples" / "models" / name, models / name, dirs_exist_ok=True)
    mlserver = workdir / "mlserver"
    mlserver.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(__file__).with_name("mlserver_runtime.py"), mlserver / "mlserver_runtime.py")
    tensors = {"identity_fp32": (["INPUT0"], ["OUTPUT0"], [-1, -1], "Identity"),
               "add_sub": (["INPUT0", "INPUT1"], ["OUTPUT0", "OUTPUT1"], [4], "AddSub")}
    for name, (inputs, outputs, shape, runtime) in tensors.items():
        (mlserver / name).mkdir(exist_ok=True)
        settings = {"name": name, "implementation": f"mlserver_runtime.{runtime}",
                    "inputs": [{"name": i, "datatype": "FP32", "shape": shape} for i in inputs],
                    "outputs": [{"name": o, "datatype": "FP32", "shape": shape} for o in outputs]}
        (mlserver / name / "model-settings.json").write_text(json.dumps(settings, indent=1))
    return {"models": models, "mlserver": mlserver}


def _spawn(name: str, command: list[str], log_path: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    with open(log_path, "wb") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=str(cwd), env=env, start_new_session=True)


def _ready(port: int, models: tuple[str, ...]) -> bool:
    try:
        for path in ("/v2/health/ready", *(f"/v2/models/{m}/ready" for m in models)):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
                if response.status != 200:
                    return False
        return True
    except (urllib.error.URLError, OSError):
        return False


def _wait_ready(server: Server) -> None:
    """Raises RuntimeError with the log tail when the server exits or is not ready in time."""
    deadline = time.monotonic() + _START_TIMEOUT
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.process.returncode}:\n{server.log_tail()}")
        if _ready(server.http_port, server.models):
            with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/v2", timeout=5) as response:
                server.extensions = list(json.load(response).get("extensions", []))
            return
        time.sleep(0.2)
    raise RuntimeError(f"{server.name} not ready after {_START_TIMEOUT:.0f} s:\n{server.log_tail()}")


def start_pystub(repositories: dict[str, Path], workdir: Path, client_shm: bool = True, *,
                 name: str = "pystub", root: Path = ROOT, cpus: str | None = None,
                 extra: list[str] | None = None, env_extra: dict[str, str] | None = None) -> Server:
    """pystub-backend from checkout `root` (default: this one); with `client_shm` it is asked for the
    system shared memory extension; with `cpus` it runs pinned to them (`taskset -c`, which its
    children inherit); `extra` flags are appended (--pystub-args); `env_extra` is added to its
    environment."""
    http, grpc, metrics = free_ports(3)
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, **(env_extra or {}), PYTHONPATH=path)
    pin = ["taskset", "-c", cpus] if cpus else []
    command = [*pin, sys.executable, "-m", "pystub_backend.backend", "--model-repository", str(repositories["models"]),
               "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    if client_shm:
        command.append("--allow-client-shm=true")
    command += extra or []
    process = _spawn(name, command, workdir / f"{name}.log", env, root)
    return Server(name, process, http, grpc, workdir / f"{name}.log", [f"pystub_{process.pid}_"])


def start_triton(env: BenchEnv, repositories: dict[str, Path], workdir: Path) -> Server:
    http, grpc, metrics = free_ports(3)
    prefix = f"bench_triton_{os.getpid()}_"
    command = [str(env.tritonserver), f"--model-repository={repositories['models']}",
               f"--backend-directory={env.triton_backends}", f"--http-port={http}", f"--grpc-port={grpc}",
               f"--metrics-port={metrics}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
               "--metrics-address=127.0.0.1", f"--backend-config=python,shm-region-prefix-name={prefix}"]
    process = _spawn("triton", command, workdir / "triton.log", env.triton_env(), workdir)
    return Server("triton", process, http, grpc, workdir / "triton.log", [prefix])


def start_mlserver(env: BenchEnv, repositories: dict[str, Path], workdir: Path) -> Server:
    http, grpc, metrics = free_ports(3)
    root = repositories["mlserver"]
    settings = {"host": "127.0.0.1", "http_port": http, "grpc_port": grpc, "metrics_port": metrics,
                "parallel_workers": 1, "grpc_max_message_length": 256 * 1024 * 1024,
                # gzip costs MLServer CPU that the others do not spend (and tritonclient.http.aio
                # does not inflate it)
                "gzip_enabled": False,
                # per-request access-log lines cost MLServer CPU that Triton and pystub do not spend
                "logging_settings": {"version": 1, "disable_existing_loggers": False,
                                     "loggers": {"uvicorn.access": {"level": "WARNING"}}}}
    (root / "settings.json").write_text(json.dumps(settings, indent=1))
    run_env = dict(os.environ, PATH=f"{env.venv / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    run_env.pop("PYTHONPATH", None)
    process = _spawn("mlserver", [str(env.mlserver), "start", str(root)], workdir / "mlserver.log", run_env, root)
    return Server("mlserver", process, http, grpc, workdir / "mlserver.log")


def start_bare(name: str, workdir: Path, python: Path | None = None) -> Server:
    """A bare-frontend ceiling (compare/bare.py) under `python` (default: this one, the project's .venv)."""
    http, grpc = free_ports(2)
    command = [str(python or sys.executable), str(Path(__file__).with_name("bare.py")), name, str(http), str(grpc)]
    process = _spawn(name, command, workdir / f"{name}.log", dict(os.environ), workdir)
    return Server(name, process, http, grpc, workdir / f"{name}.log")


def start_floor(workdir: Path) -> Server:
    """The floor (tools/floor/serve.py, a parent and its model process) under this interpreter."""
    http, grpc = free_ports(2)
    command = [sys.executable, str(ROOT / "tools" / "floor" / "serve.py"), str(http), str(grpc)]
    process = _spawn("floor", command, workdir / "floor.log", dict(os.environ), workdir)
    return Server("floor", process, http, grpc, workdir / "floor.log", models=("identity_fp32",))


def wait_ready(servers: list[Server]) -> None:
    """Wait for every server; raises RuntimeError naming the first that failed."""
    for server in servers:
        _wait_ready(server)


def _wait_group(pgid: int, seconds: float) -> None:
    """Wait until no process is left in group `pgid`, at most `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1)


def stop(server: Server) -> None:
    """SIGTERM the leader, wait, SIGKILL the group's leftovers, remove the server's /dev/shm segments."""
    process = server.process
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            print(f"{server.name} did not stop in {_STOP_TIMEOUT:.0f} s: killing it", file=sys.stderr)
    _wait_group(process.pid, 5.0)  # helpers (stubs, MLServer's resource tracker) finish their own cleanup
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(10)
    sweep_shm([server])


def sweep_shm(stopped: list[Server]) -> None:
    """Remove the /dev/shm segments that carry the prefixes of these (stopped) servers."""
    for server in stopped:
        for prefix in server.shm_prefixes:
            for entry in Path("/dev/shm").glob(f"{prefix}*"):
                with contextlib.suppress(OSError):
                    entry.unlink()
