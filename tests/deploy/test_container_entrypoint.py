"""The container's entrypoint as the image runs it: uid 1000, a read-only repository, a 64 MiB
/dev/shm, the Dockerfile's healthcheck, and SIGTERM draining running requests (container_sandbox)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient
from container_sandbox import (
    SHM_BYTES,
    UID,
    ContainerBackend,
    dockerfile_instruction,
    probe,
    sandboxed_repository,
    unavailable,
)

REASON = unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture()
def sandbox() -> Iterator[tuple[Path, list[str]]]:
    with sandboxed_repository("pystub-container-", "identity_fp32", "add_sub", "slow") as sandbox:
        yield sandbox


def _identity(url: str, data: np.ndarray) -> np.ndarray:
    with httpclient.InferenceServerClient(url, network_timeout=60) as client:
        tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data, binary_data=True)
        return client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0")


def _wait_for_client_connection(pid: int, port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED
               for c in psutil.Process(pid).net_connections("tcp")):
            return
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout} s waiting for the client's connection to port {port}")


def test_the_sandbox_is_what_the_container_gives(sandbox: tuple[Path, list[str]]) -> None:
    repository, wrapper = sandbox
    done = probe(wrapper, "sh", "-c", f"id -u; stat -f -c '%b %S' /dev/shm; touch '{repository}/written'")
    lines = done.stdout.split()
    assert lines[0] == str(UID)
    assert int(lines[1]) * int(lines[2]) == SHM_BYTES
    assert done.returncode != 0 and "Read-only file system" in done.stderr


def test_entrypoint_serves_as_uid_1000_from_a_read_only_repository_in_64mib_shm(
        sandbox: tuple[Path, list[str]]) -> None:
    repository, wrapper = sandbox
    with ContainerBackend(repository, wrapper) as backend:
        processes = [psutil.Process(backend.pid), *backend.stub_processes()]
        assert len(processes) == 4  # the server and one stub per model
        assert {p.uids().effective for p in processes} == {UID}
        shm = os.statvfs(f"/proc/{backend.pid}/root/dev/shm")  # seen through the server's mounts
        assert shm.f_blocks * shm.f_frsize == SHM_BYTES
        data = np.random.default_rng(7).random((1, 4 * 2**20 // 4), dtype=np.float32)  # 4 MiB both ways
        np.testing.assert_array_equal(_identity(backend.http_url, data), data)
        healthcheck = dockerfile_instruction("HEALTHCHECK")
        healthcheck = [a.replace("127.0.0.1:8000", backend.http_url) for a in healthcheck]
        assert subprocess.run(healthcheck, timeout=30).returncode == 0
    assert not list(repository.rglob("__pycache__"))  # nothing was written into the read-only repository


def test_sigterm_drains_a_running_request_and_exits_0(sandbox: tuple[Path, list[str]]) -> None:
    repository, wrapper = sandbox
    backend = ContainerBackend(repository, wrapper).start()
    result: dict[str, object] = {}

    def slow_request() -> None:
        try:
            with httpclient.InferenceServerClient(backend.http_url, network_timeout=60) as client:
                tensor = httpclient.InferInput("DELAY_MS", [1], "INT32")
                tensor.set_data_from_numpy(np.array([2000], dtype=np.int32))
                result["output"] = client.infer("slow", [tensor]).as_numpy("OUTPUT0")
        except Exception as exc:  # reported by the assertion below
            result["error"] = exc

    try:
        worker = threading.Thread(target=slow_request)
        worker.start()
        _wait_for_client_connection(backend.pid, backend.ports["http"])
        time.sleep(0.5)  # the small request has reached execute()
        started = time.monotonic()
        backend.process.terminate()  # type: ignore[union-attr]
        code = backend.wait_exit(35)  # within the 30 s --exit-timeout-secs of the image's CMD
        elapsed = time.monotonic() - started
        worker.join(30)
    finally:
        backend.stop(check=False)
    assert code == 0, backend.log()
    assert "error" not in result, result.get("error")
    np.testing.assert_array_equal(result["output"], [2000])
    assert 1.0 < elapsed < 30.0, elapsed
