"""The bare gRPC ceilings of tools/compare/bare.py speak gRPC as perf_analyzer needs it.

Each candidate is started as the bench harness starts it (its own session, readiness on its HTTP
port) and asked, with tritonclient, for what perf_analyzer asks: model metadata and config, then
an inference whose tensor must come back unchanged. A method it does not serve must fail with
UNIMPLEMENTED, which only a server that sends grpc-status in HTTP/2 trailers can say. The
grpcio candidates run under this interpreter; the candidates from PyPI need their own venv
(tools/compare/environment.py `ensure_candidates`) and are skipped where it is not installed.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from harness import ROOT
from net import free_ports, wait_http_ready
from tritonclient.utils import InferenceServerException

BARE = ROOT / "tools" / "compare" / "bare.py"
GRPCIO_MODES = ("bare-grpc-aio", "bare-grpc-sync", "bare-grpc-sync-hop")
PYPI_MODES = ("bare-grpc-native-aio", "bare-grpc-native-sync", "bare-grpc-native-front", "bare-grpclib",
              "bare-grpc-hypercorn", "bare-grpc-h2corn", "bare-grpc-ngh2", "bare-grpc-ngh2-asyncio")
_START_TIMEOUT = 30.0


def _candidates_python() -> Path | None:
    bench = Path(os.environ.get("PYSTUB_BENCH_DIR") or ROOT / ".bench")
    python = bench / "candidates" / "bin" / "python"
    return python if python.exists() else None


def _serve(mode: str, python: Path | str) -> Iterator[int]:
    """Run `mode` in its own session; yields its gRPC port; kills the whole group after."""
    http_port, grpc_port = free_ports(2)
    process = subprocess.Popen([str(python), str(BARE), mode, str(http_port), str(grpc_port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        wait_http_ready(process, http_port, mode, _START_TIMEOUT)
        yield grpc_port
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


@pytest.fixture(params=GRPCIO_MODES)
def grpcio_candidate(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    for port in _serve(request.param, sys.executable):
        yield request.param, port


@pytest.fixture(params=PYPI_MODES)
def pypi_candidate(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    python = _candidates_python()
    if python is None:
        missing = "the candidates' venv (.bench/candidates) is not installed (./dev.sh test installs it)"
        if os.environ.get("CI", "").lower() == "true":  # CI installs everything it tests: missing is a failure
            pytest.fail(missing)
        pytest.skip(missing)
    for port in _serve(request.param, python):
        yield request.param, port


def _check_speaks_grpc(mode: str, port: int) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        assert client.get_model_metadata("identity_fp32", client_timeout=10).name == "identity_fp32", mode
        assert client.get_model_config("identity_fp32", client_timeout=10).config.max_batch_size == 8, mode
        data = np.random.default_rng().random((1, 5), dtype=np.float32)
        tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        result = client.infer("identity_fp32", [tensor], client_timeout=10)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
        with pytest.raises(InferenceServerException) as refused:
            client.get_inference_statistics(client_timeout=10)
        assert refused.value.status() == str(grpc.StatusCode.UNIMPLEMENTED), (mode, refused.value)
    finally:
        client.close()


def test_grpcio_candidates_speak_grpc(grpcio_candidate: tuple[str, int]) -> None:
    _check_speaks_grpc(*grpcio_candidate)


def test_pypi_candidates_speak_grpc(pypi_candidate: tuple[str, int]) -> None:
    _check_speaks_grpc(*pypi_candidate)


def test_bench_measures_the_hop_and_skips_candidates_it_cannot_install(tmp_path: Path) -> None:
    """With --no-install and no candidates' venv, the harness drops the PyPI ceilings with a note
    and still measures the grpcio ones (here the hop) beside pystub; every process is gone after."""
    env = dict(os.environ, PYSTUB_BENCH_DIR=str(tmp_path))
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_compare.py"), "--quick", "--servers", "pystub",
                          "--loadgen", "asyncio", "--models", "identity_fp32", "--sizes", "16", "--concurrency", "2",
                          "--seconds", "0.5", "--warmup", "0.2", "--protocols", "grpc", "--no-shm", "--no-probe",
                          "--no-install", "--ceilings", "bare-grpc-sync-hop,bare-grpc-ngh2-asyncio"],
                         capture_output=True, text=True, timeout=90, cwd="/", env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ceilings bare-grpc-ngh2-asyncio skipped" in run.stdout, run.stdout
    assert not (tmp_path / "candidates").exists()
    row = next(line.split("|") for line in run.stdout.splitlines() if line.startswith("identity_fp32"))
    assert float(row[1].split()[0]) > 0 and float(row[2].split()[0]) > 0, row  # pystub, bare-grpc-sync-hop
    pids = [int(pid) for pid in re.findall(r"started \S+ pid (\d+)", run.stderr)]
    assert len(pids) == 2, run.stderr[-2000:]
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)


def test_cpu_cost_reads_each_servers_cpu_per_call() -> None:
    """tools/grpc_cpu_cost.py: a positive CPU time per call for pystub and a bare ceiling, and
    nothing left running. Which of the two spends more is the tool's finding, not this test's: at
    800 calls its resolution is 12.5 µs a call, and the two have read the same."""
    medians, output = _cpu_cost("pystub-aio,bare-grpc-aio", "--calls", "800", "--warmup", "80")
    assert set(medians) == {"pystub-aio", "bare-grpc-aio"}, output
    assert medians["pystub-aio"] > 0 and medians["bare-grpc-aio"] > 0, output


def test_cpu_cost_counts_every_process_of_the_servers_group() -> None:
    """What the tool adds up is the whole group: a child (as a stub is a child of pystub's process)
    that spends 0.3 s of CPU counts with its parent's, even when the parent spends none."""
    sys.path.insert(0, str(ROOT / "tools"))
    from grpc_cpu_cost import group_cpu_seconds

    burn = ("import subprocess, sys\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time\\n"
            "while time.process_time() < 0.3: pass\\nprint(flush=True)\\ninput()'],"
            " stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n"
            "child.stdout.readline(); print(flush=True); input(); child.communicate(b'\\n')\n")
    parent = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              start_new_session=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline() == b"\n", "the child to burn its CPU"
        assert group_cpu_seconds(parent.pid) >= 0.3
    finally:
        parent.communicate(b"\n", timeout=30)


def test_cpu_cost_of_streamed_requests_on_either_grpc_stack() -> None:
    """--stream: the CPU per request sent over ModelStreamInfer, for pystub on each gRPC stack."""
    medians, output = _cpu_cost("pystub-h2,pystub-aio", "--stream", "--calls", "400", "--warmup", "40")
    assert set(medians) == {"pystub-h2", "pystub-aio"}, output
    assert min(medians.values()) > 0, output


def _cpu_cost(servers: str, *args: str) -> tuple[dict[str, float], str]:
    """tools/grpc_cpu_cost.py's medians per server, and its output; checks that nothing is left running."""
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "grpc_cpu_cost.py"), "--servers", servers, *args,
                          "--rounds", "1"], capture_output=True, text=True, timeout=120, cwd="/")
    assert run.returncode == 0, run.stderr[-3000:]
    leftovers = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
                 if p.info["cmdline"] and any("pystub-cpu-cost-" in part for part in p.info["cmdline"])]
    assert not leftovers, leftovers
    medians = re.findall(r"^  (\S+) +([\d.]+) µs", run.stdout, re.MULTILINE)
    return {name: float(value) for name, value in medians}, run.stdout
