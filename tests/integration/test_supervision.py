"""Stub supervision: the fault catalogue. Every fault fails only what it must, the stub
comes back with `initialize` run again, other models keep serving, and nothing leaks."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import Backend, make_repository, module_backend
from tritonclient.utils import InferenceServerException

HEARTBEAT = ["--backend-config=python,stub-heartbeat-timeout-seconds=1"]


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("supervision"), "faulty", "add_sub")
    with module_backend(Backend(repository, *HEARTBEAT)) as server:
        yield server


def stubs(backend: Backend) -> dict[str, dict]:
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/pystub/stubs", timeout=10) as response:
        return {row["instance"]: row for row in json.loads(response.read())["stubs"]}


def call(backend: Backend, mode: int, model: str = "faulty") -> int:
    """Infer; returns OUTPUT0 or raises InferenceServerException."""
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        tensor = grpcclient.InferInput("MODE", [1], "INT32")
        tensor.set_data_from_numpy(np.array([mode], np.int32))
        return int(client.infer(model, [tensor], client_timeout=60).as_numpy("OUTPUT0")[0])
    finally:
        client.close()


def add_sub_works(backend: Backend) -> bool:
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones(4, np.float32))
        return bool(np.array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), np.full(4, 2.0)))
    finally:
        client.close()


def wait_healthy(backend: Backend, instance: str = "faulty_0", restarts: int | None = None,
                 timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = stubs(backend)[instance]
        if row["healthy"] and (restarts is None or row["restarts"] >= restarts):
            return row
        time.sleep(0.05)
    raise AssertionError(f"{instance} did not come back within {timeout} s: {stubs(backend)[instance]}")


def shm_count(backend: Backend) -> int:
    """The backend's /dev/shm entries once both models have served (so their arenas exist)."""
    assert call(backend, 0) == 0 and add_sub_works(backend)
    return len(backend.shm_entries())


@pytest.mark.parametrize("mode, cause", [(1, "SIGSEGV"), (2, "exited with code 3")])
def test_crash_fails_the_request_and_the_stub_comes_back(backend: Backend, mode: int, cause: str):
    before = stubs(backend)["faulty_0"]
    shm_before = shm_count(backend)
    with pytest.raises(InferenceServerException) as info:
        call(backend, mode)
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    assert info.value.message() == "Stub process 'faulty_0' is not healthy."
    row = wait_healthy(backend, restarts=before["restarts"] + 1)
    assert row["pid"] != before["pid"]
    assert call(backend, 0) == 0
    assert add_sub_works(backend)
    assert shm_count(backend) == shm_before
    assert cause in backend.log()


def test_hang_in_execute_hits_the_execute_deadline(backend: Backend):
    before = stubs(backend)["faulty_0"]
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as info:
        call(backend, 3)
    detected = time.monotonic() - started
    assert info.value.message() == "Stub process 'faulty_0' is not healthy."
    assert 1.5 < detected < 5.0, detected  # EXECUTE_TIMEOUT_SECONDS is 2
    wait_healthy(backend, restarts=before["restarts"] + 1)
    assert "EXECUTE_TIMEOUT_SECONDS=2" in backend.log()
    assert call(backend, 0) == 0


def test_frozen_stub_is_caught_by_its_heartbeat(backend: Backend):
    before = stubs(backend)["faulty_0"]
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as info:
        call(backend, 4)  # SIGSTOP: the heartbeat thread stops too
    detected = time.monotonic() - started
    assert info.value.message() == "Stub process 'faulty_0' is not healthy."
    assert detected < 4.0, detected  # heartbeat timeout is 1 s
    wait_healthy(backend, restarts=before["restarts"] + 1)
    assert not psutil.pid_exists(before["pid"])  # killed and reaped before the new one started
    assert "no heartbeat for" in backend.log()


def test_memory_limit_fails_the_request_not_the_stub(backend: Backend):
    before = stubs(backend)["faulty_0"]
    with pytest.raises(InferenceServerException) as info:
        call(backend, 5)
    assert "MemoryError" in info.value.message()
    after = stubs(backend)["faulty_0"]
    assert after["pid"] == before["pid"] and after["restarts"] == before["restarts"]
    assert call(backend, 0) == 0


def test_prints_reach_the_log_once_per_line_with_the_instance(backend: Backend):
    call(backend, 6)
    backend.wait_for_log(r"\[faulty_0\] faulty: line three")
    log = backend.log()
    for line in ("line one", "line two", "line three"):
        assert log.count(f"[faulty_0] faulty: {line}") == 1


def test_kill_9_under_load_fails_only_in_flight_requests(tmp_path: Path):
    """The issue's acceptance scenario, on a fresh backend (no earlier failures, so no back-off
    beyond the first step); prints the detection and restart times it measured."""
    with Backend(make_repository(tmp_path, "faulty", "add_sub"), *HEARTBEAT) as backend:
        _kill_9_under_load(backend)


def _kill_9_under_load(backend: Backend) -> None:
    before = stubs(backend)["faulty_0"]
    shm_before = shm_count(backend)
    outcomes: list[tuple[float, str]] = []
    stop = threading.Event()

    def load() -> None:
        client = grpcclient.InferenceServerClient(backend.grpc_url)
        tensor = grpcclient.InferInput("MODE", [1], "INT32")
        tensor.set_data_from_numpy(np.array([7], np.int32))  # 300 ms per request: always one in flight
        try:
            while not stop.is_set():
                try:
                    client.infer("faulty", [tensor], client_timeout=60)
                    outcomes.append((time.monotonic(), "ok"))
                except InferenceServerException as error:
                    outcomes.append((time.monotonic(), error.message()))
        finally:
            client.close()

    workers = [threading.Thread(target=load) for _ in range(2)]
    for worker in workers:
        worker.start()
    time.sleep(1.0)
    killed_at = time.monotonic()
    os.kill(before["pid"], signal.SIGKILL)
    row = wait_healthy(backend, restarts=before["restarts"] + 1)
    back_at = time.monotonic()
    time.sleep(1.0)
    stop.set()
    for worker in workers:
        worker.join(30)
    errors = [(t, text) for t, text in outcomes if text != "ok"]
    assert 1 <= len(errors) <= 2, errors  # two clients: at most one request each was in flight
    assert all(text == "Stub process 'faulty_0' is not healthy." for _, text in errors), errors
    detection = min(t for t, _ in errors) - killed_at
    assert detection < 0.5, detection
    assert any(t > back_at and text == "ok" for t, text in outcomes), "requests succeed once it is back"
    assert row["restarts"] == before["restarts"] + 1
    assert shm_count(backend) == shm_before
    print(f"\nkill -9: first failure after {detection * 1000:.0f} ms, stub back after "
          f"{(back_at - killed_at) * 1000:.0f} ms, {len(errors)} in-flight requests failed, "
          f"{len(outcomes) - len(errors)} succeeded")


def test_repeated_crashes_mark_the_instance_failed(tmp_path: Path):
    repository = make_repository(tmp_path, "faulty", "add_sub")
    settings = [*HEARTBEAT, "--backend-config=python,stub-max-restarts=2"]
    with Backend(repository, *settings) as backend:
        for expected_restarts in (1, 2):
            with pytest.raises(InferenceServerException):
                call(backend, 2)
            wait_healthy(backend, restarts=expected_restarts)
        with pytest.raises(InferenceServerException):
            call(backend, 2)
        deadline = time.monotonic() + 10
        while stubs(backend)["faulty_0"]["state"] != "FAILED" and time.monotonic() < deadline:
            time.sleep(0.05)
        row = stubs(backend)["faulty_0"]
        assert row["state"] == "FAILED" and "failures within" in row["last_error"]
        time.sleep(1.0)
        assert stubs(backend)["faulty_0"]["state"] == "FAILED"  # no respawn loop
        with pytest.raises(InferenceServerException) as info:
            call(backend, 0)
        assert info.value.message() == "Stub process 'faulty_0' is not healthy."
        client = httpclient.InferenceServerClient(backend.http_url)
        try:
            assert not client.is_model_ready("faulty")
            assert client.is_model_ready("add_sub")
        finally:
            client.close()
        assert add_sub_works(backend)


def test_stubs_exit_when_the_backend_is_killed(tmp_path: Path):
    backend = Backend(make_repository(tmp_path, "add_sub", "faulty")).start()
    pids = [p.pid for p in backend.stub_processes()]
    assert len(pids) == 2
    stale = backend.shm_entries()
    os.kill(backend.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids):
        assert time.monotonic() < deadline, "a stub outlived its backend by 5 s"
        time.sleep(0.05)
    backend.stop(check=False)
    # The next backend sweeps what the dead one could not unlink (its pid is dead).
    with Backend(make_repository(tmp_path / "again", "add_sub")):
        assert all(not os.path.exists(f"/dev/shm/{name}") for name in stale)


def test_finalize_that_raises_is_logged_and_shutdown_is_clean(tmp_path: Path):
    backend = Backend(make_repository(tmp_path, "faulty")).start()
    assert backend.stop() == 0
    assert "finalize failed on purpose" in backend.log()
