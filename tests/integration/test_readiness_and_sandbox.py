"""Readiness (`is_ready`), the sandbox (execution environments, limits, umask), the shutdown
ladder, and operator restarts through stubctl."""

from __future__ import annotations

import concurrent.futures
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import ROOT, Backend, make_repository

PYTHON = sys.executable


def set_state(backend: Backend, model: str, name: str, value: int, output: str) -> np.ndarray:
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        tensor = httpclient.InferInput(name, [1], "INT32")
        tensor.set_data_from_numpy(np.array([value], np.int32))
        return client.infer(model, [tensor]).as_numpy(output)
    finally:
        client.close()


def ready(backend: Backend, model: str) -> tuple[bool, bool]:
    http = httpclient.InferenceServerClient(backend.http_url)
    grpc = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        return http.is_model_ready(model), grpc.is_model_ready(model)
    finally:
        http.close()
        grpc.close()


def test_user_defined_is_ready(tmp_path: Path):
    with Backend(make_repository(tmp_path, "ready_check", "add_sub")) as backend:
        assert ready(backend, "ready_check") == (True, True)
        for state, text in ((1, "Model 'ready_check_0' is not ready (user-defined check failed)."),
                            (2, "is_ready() must return a boolean value"),
                            (3, "readiness probe exploded")):
            set_state(backend, "ready_check", "STATE", state, "OUTPUT0")  # inference goes on while not ready
            assert ready(backend, "ready_check") == (False, False)
            backend.wait_for_log(r"Model 'ready_check' version 1 is not ready: .*" + text.replace("(", r"\(")
                                 .replace(")", r"\)").replace(".", r"\."))
        set_state(backend, "ready_check", "STATE", 5, "OUTPUT0")  # async is_ready
        assert ready(backend, "ready_check") == (True, True)
        assert ready(backend, "add_sub") == (True, True)


def test_is_ready_times_out_and_concurrent_checks_share_one_call(tmp_path: Path):
    with Backend(make_repository(tmp_path, "ready_check")) as backend:
        calls_before = int(set_state(backend, "ready_check", "STATE", 4, "OUTPUT0")[0])
        started = time.monotonic()
        def http_ready(_: int) -> bool:
            client = httpclient.InferenceServerClient(backend.http_url, network_timeout=30)
            try:
                return client.is_model_ready("ready_check")
            finally:
                client.close()

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(http_ready, range(4)))
        elapsed = time.monotonic() - started
        assert answers == [False] * 4
        assert 4.5 < elapsed < 8, elapsed
        backend.wait_for_log("Timed out waiting for user-defined is_ready\\(\\) response")
        calls_after = int(set_state(backend, "ready_check", "STATE", 0, "OUTPUT0")[0])
        assert calls_after - calls_before == 1


def _write_env(directory: Path, marker: str) -> Path:
    """A minimal execution environment: bin/activate sets a marker and puts bin/ on PATH, where
    `python` runs this test's interpreter (a script, not a link: links leaving an archive are refused)."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "activate").write_text(f'export PYSTUB_TEST_ENV_MARKER="{marker}"\n'
                                      f'export PATH="{bin_dir}:$PATH"\n')
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\nexec "{PYTHON}" "$@"\n')
    python.chmod(0o755)
    return directory


def _env_facts(backend: Backend) -> dict:
    return json.loads(set_state(backend, "env_model", "INPUT0", 0, "ENV")[0])


def _use_env(repository: Path, value: str) -> None:
    config = repository / "env_model" / "config.pbtxt"
    config.write_text(config.read_text() +
                      f'parameters {{ key: "EXECUTION_ENV_PATH", value: {{ string_value: "{value}" }} }}\n')


def test_execution_env_directory_limits_and_umask(tmp_path: Path):
    repository = make_repository(tmp_path, "env_model")
    _write_env(tmp_path / "env", "from-directory")
    _use_env(repository, str(tmp_path / "env"))
    with Backend(repository) as backend:
        facts = _env_facts(backend)
    assert facts == {"marker": "from-directory", "nofile": 200, "umask": 0o077}


def test_execution_env_archive_is_extracted_once(tmp_path: Path):
    repository = make_repository(tmp_path, "env_model")
    env = _write_env(tmp_path / "packed", "from-archive")
    with tarfile.open(repository / "env_model" / "env.tar.gz", "w:gz") as archive:
        archive.add(env, arcname=".")
    _use_env(repository, "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    cache = tmp_path / "cache"
    with Backend(repository, env={"XDG_CACHE_HOME": str(cache)}) as backend:
        assert _env_facts(backend)["marker"] == "from-archive"
        assert backend.log().count("Extracting Python execution env") == 1
    with Backend(repository, env={"XDG_CACHE_HOME": str(cache)}) as backend:  # cached: not again
        assert _env_facts(backend)["marker"] == "from-archive"
        assert "Extracting Python execution env" not in backend.log()


def test_unsafe_archive_is_refused(tmp_path: Path):
    repository = make_repository(tmp_path, "env_model", "add_sub")
    with tarfile.open(repository / "env_model" / "env.tar.gz", "w:gz") as archive:
        payload = b"pwned"
        info = tarfile.TarInfo("../escaped.txt")
        info.size = len(payload)
        archive.addfile(info, io.BytesIO(payload))
    _use_env(repository, "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    with Backend(repository, "--exit-on-error=false", env={"XDG_CACHE_HOME": str(tmp_path / "c")}) as backend:
        assert "Path contains '..'" in backend.log()
        assert ready(backend, "env_model") == (False, False)
        assert ready(backend, "add_sub") == (True, True)
    assert not (tmp_path / "escaped.txt").exists() and not list(tmp_path.rglob("escaped.txt"))


def test_shutdown_ladder_ends_a_stub_whose_finalize_hangs(tmp_path: Path):
    backend = Backend(make_repository(tmp_path, "slow_finalize", "add_sub"), "--exit-timeout-secs=1").start()
    stubs = backend.stub_processes()
    started = time.monotonic()
    assert backend.stop() == 0
    assert time.monotonic() - started < 10
    assert all(not stub.is_running() for stub in stubs)
    assert "timed out after 1 s waiting for finalize from stub 'slow_finalize_0'" in backend.log()


def test_stubctl_restart_runs_initialize_again(tmp_path: Path):
    with Backend(make_repository(tmp_path, "args_echo")) as backend:
        stubctl = [sys.executable, str(ROOT / "tools" / "stubctl"), "--url", backend.http_url]
        before = json.loads(subprocess.run(stubctl + ["--json"], capture_output=True, text=True,
                                           timeout=30).stdout)
        result = subprocess.run(stubctl + ["restart", "args_echo", "args_echo_0_1"], capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "restarted: args_echo_0_1"
        after = {row["instance"]: row for row in json.loads(subprocess.run(
            stubctl + ["--json"], capture_output=True, text=True, timeout=30).stdout)}
        old = {row["instance"]: row for row in before}
        assert after["args_echo_0_1"]["restarts"] == 1 and after["args_echo_0_0"]["restarts"] == 0
        assert after["args_echo_0_1"]["pid"] != old["args_echo_0_1"]["pid"]
        assert after["args_echo_0_0"]["pid"] == old["args_echo_0_0"]["pid"]
        assert os.path.exists(f"/proc/{after['args_echo_0_1']['pid']}")
        missing = subprocess.run(stubctl + ["restart", "nope"], capture_output=True, text=True, timeout=30)
        assert missing.returncode == 1 and "no loaded model 'nope'" in missing.stderr


@pytest.mark.parametrize("peer, allowed", [("127.0.0.1", True), ("::1", True), ("10.1.2.3", False),
                                           ("192.168.0.7", False), ("", False)])
def test_admin_changes_are_loopback_only(peer: str, allowed: bool):
    from aiohttp.test_utils import make_mocked_request

    from pystub_backend.backend.frontends.access import is_loopback
    class _Transport:
        def get_extra_info(self, name, default=None):
            return (peer, 1234) if name == "peername" else default

    request = make_mocked_request("POST", "/v2/pystub/stubs/m/restart", transport=_Transport())
    assert is_loopback(request.remote or "") is allowed
