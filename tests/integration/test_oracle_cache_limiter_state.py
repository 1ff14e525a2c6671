"""Real Triton 2.51 as the oracle: the same repository and requests to Triton and to pystub, and the
same observations from both (response cache hits and counters, the cache's metric families, the
rate limiter's mutual exclusion, what a model with implicit state sees and returns).

Triton is the one `tools/bench_compare.py` installs into `.bench/venv` (tools/compare/environment.py);
without it these tests skip. Nothing here installs anything: Triton's files are used read-only, its
backend and cache directories are symlinks under the test's temporary directory.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import signal
import subprocess
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import LONG_LIVED_PIDS, ROOT, Backend, make_repository, module_backend
from net import free_ports

_DIST = sorted(glob.glob(str(ROOT / ".bench" / "venv" / "lib" / "python3*" / "site-packages" / "pytriton" /
                              "tritonserver")))
_VERSION = sysconfig.get_python_version()  # "3.11": the stub built for this interpreter
pytestmark = pytest.mark.skipif(not _DIST or not (Path(_DIST[0]) / "bin" / "tritonserver").exists(),
                                reason="real Triton is not installed in .bench (tools/bench_compare.py installs it)")

FLAGS = ("--cache-config=local,size=1048576", "--rate-limit=execution_count")
_START_TIMEOUT = 90.0


@dataclass
class Server:
    name: str
    http: int
    grpc: int
    metrics: int


def _triton_dirs(dist: Path, work: Path) -> tuple[Path, Path]:
    """backends/python and caches/local as Triton wants them, from symlinks to the installed files."""
    backends, caches = work / "backends" / "python", work / "caches" / "local"
    backends.mkdir(parents=True)
    caches.mkdir(parents=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        (backends / name).symlink_to(dist / "backends" / "python" / name)
    (backends / "triton_python_backend_stub").symlink_to(dist / "python_backend_stubs" / _VERSION /
                                                         "triton_python_backend_stub")
    (caches / "libtritoncache_local.so").symlink_to(dist / "caches" / "local" / "libtritoncache_local.so")
    return backends.parent, caches.parent


def _wait_ready(port: int, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + _START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"tritonserver exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(urllib.error.URLError, OSError), \
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as response:
            if response.status == 200:
                return
        time.sleep(0.2)
    raise AssertionError(f"tritonserver not ready after {_START_TIMEOUT} s:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def triton(repository: Path, work: Path) -> Iterator[Server]:
    dist = Path(_DIST[0])
    backends, caches = _triton_dirs(dist, work)
    venv = dist.parents[4]
    http, grpc, metrics = free_ports(3)
    prefix = f"oracle_triton_{os.getpid()}_"
    env = dict(os.environ, PATH=f"{venv / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
               LD_LIBRARY_PATH=":".join([sysconfig.get_config_var("LIBDIR") or "",
                                         os.environ.get("LD_LIBRARY_PATH", "")]))
    env.pop("PYTHONPATH", None)
    command = [str(dist / "bin" / "tritonserver"), f"--model-repository={repository}",
               f"--backend-directory={backends}", f"--cache-directory={caches}", f"--http-port={http}",
               f"--grpc-port={grpc}", f"--metrics-port={metrics}", "--http-address=127.0.0.1",
               "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
               f"--backend-config=python,shm-region-prefix-name={prefix}", *FLAGS]
    log = work / "triton.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, cwd=str(work), start_new_session=True)
    LONG_LIVED_PIDS.add(process.pid)
    try:
        _wait_ready(http, process, log)
        yield Server("triton", http, grpc, metrics)
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        LONG_LIVED_PIDS.discard(process.pid)
        for entry in Path("/dev/shm").glob(f"{prefix}*"):
            entry.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    work = Path(tmp_path_factory.mktemp("oracle"))
    repository = make_repository(work, "cache_probe", "span_probe", "state_probe")
    (repository / "state_file" / "1").mkdir(parents=True)
    (repository / "state_file" / "initial_state").mkdir()
    (repository / "state_file" / "initial_state" / "init.bin").write_bytes(np.float32(100).tobytes())
    (repository / "state_file" / "config.pbtxt").write_text(
        (repository / "state_probe" / "config.pbtxt").read_text().replace("zero_data: true", 'data_file: "init.bin"'))
    model = (repository / "state_probe" / "1" / "model.py").read_text()
    (repository / "state_file" / "1" / "model.py").write_text(model)
    with triton(repository, work) as oracle, module_backend(Backend(repository, *FLAGS)) as backend:
        yield [oracle, Server("pystub", backend.ports["http"], backend.ports["grpc"], backend.ports["metrics"])]


# -- observations --------------------------------------------------------------------------------------


def cache_observations(server: Server) -> dict[str, Any]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http}", network_timeout=60)
    try:
        def calls(values: np.ndarray, **kwargs: Any) -> int:
            tensor = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
            tensor.set_data_from_numpy(values)
            return int(client.infer("cache_probe", [tensor], **kwargs).as_numpy("CALLS")[0])

        a, b = np.arange(4, dtype=np.float32), np.arange(4, dtype=np.float32) + 1
        sequence = [calls(a), calls(a), calls(a, parameters={"tag": "x"}), calls(b), calls(a)]
        # Triton records a request's statistics after it has sent the response: read until every
        # call is counted (bounded), so a lagging oracle is not taken for a difference.
        deadline = time.monotonic() + 5
        row = client.get_inference_statistics("cache_probe")["model_stats"][0]
        while row["inference_stats"]["success"]["count"] < len(sequence) and time.monotonic() < deadline:
            time.sleep(0.05)
            row = client.get_inference_statistics("cache_probe")["model_stats"][0]
    finally:
        client.close()
    stats = row["inference_stats"]
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics}/metrics", timeout=30) as response:
        text = response.read().decode()
    families = re.findall(r"^# TYPE (nv_cache\S*) (\S+)$", text, re.MULTILINE)
    per_model = {name: float(value) for name, value in
                 re.findall(r'^(nv_cache_num_\w+_per_model)\{model="cache_probe",version="1"\} (\S+)$', text,
                            re.MULTILINE)}
    return {"calls": sequence, "hits": stats["cache_hit"]["count"], "misses": stats["cache_miss"]["count"],
            "success": stats["success"]["count"], "executions": row["execution_count"],
            "families": families, "per_model": per_model}


def span_overlaps(server: Server) -> int:
    def one(_: int) -> tuple[float, float]:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http}", network_timeout=60)
        try:
            tensor = httpclient.InferInput("DELAY_MS", [1], "INT32")
            tensor.set_data_from_numpy(np.array([200], np.int32))
            start, end = client.infer("span_probe", [tensor]).as_numpy("SPAN").tolist()
            return start, end
        finally:
            client.close()

    with ThreadPoolExecutor(4) as pool:
        spans = sorted(pool.map(one, range(4)))
    return sum(1 for before, after in zip(spans, spans[1:], strict=False) if after[0] < before[1])


def state_observations(server: Server, model: str) -> list[Any]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    try:
        seen = []
        for value in (1, 2, 3):
            tensor = grpcclient.InferInput("INPUT", [1], "FP32")
            tensor.set_data_from_numpy(np.array([value], np.float32))
            result = client.infer(model, [tensor], sequence_id=77, sequence_start=value == 1, sequence_end=value == 3)
            seen.append({"outputs": sorted(o.name for o in result.get_response().outputs),
                         "output": result.as_numpy("OUTPUT").tolist(), "seen": json.loads(result.as_numpy("SEEN")[0])})
        return seen
    finally:
        client.close()


# -- the comparisons -----------------------------------------------------------------------------------


def test_cache_answers_and_counts_as_triton(servers: list[Server]) -> None:
    oracle, pystub = (cache_observations(server) for server in servers)
    assert oracle["calls"] == [1, 1, 1, 2, 1]  # the oracle itself behaves as the tests assume
    assert pystub == oracle


def test_rate_limited_instances_never_overlap_on_either(servers: list[Server]) -> None:
    assert [span_overlaps(server) for server in servers] == [0, 0]


@pytest.mark.parametrize("model", ["state_probe", "state_file"])
def test_implicit_state_as_triton_serves_it(servers: list[Server], model: str) -> None:
    oracle, pystub = (state_observations(server, model) for server in servers)
    assert pystub == oracle
