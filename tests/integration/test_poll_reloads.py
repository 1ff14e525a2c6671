"""Reloads in poll mode that go wrong: an `initialize` that hangs blocks neither the repository poll,
nor other models, nor shutdown; a reload that fails leaves the serving version restarting from its
own files, and the repository index says what each version is."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from harness import Backend
from tritonclient.utils import InferenceServerException

CONFIG = """backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

# execute adds ADD (each variant differs in size too, so the poll sees every rewrite).
ADDING = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() + {add})]) for r in requests]
"""
HANGING = """
import threading


class TritonPythonModel:
    def initialize(self, args):
        threading.Event().wait()  # never returns: only the init timeout or shutdown ends it

    def execute(self, requests):
        return []
"""
FAILING = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("this version of the model cannot start")

    def execute(self, requests):
        return []
"""
POLL = ("--model-control-mode=poll", "--repository-poll-secs=0.2", "--exit-timeout-secs=30")


def _write_model(repository: Path, name: str, source: str) -> None:
    version = repository / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    (repository / name / "config.pbtxt").write_text(CONFIG)
    (version / "model.py").write_text(source)


def _wait(condition: Callable[[], Any], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def _infer(client: httpclient.InferenceServerClient, name: str) -> np.ndarray:
    tensor = httpclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.ones(4, np.float32))
    return client.infer(name, [tensor]).as_numpy("OUTPUT0")


def _answers(client: httpclient.InferenceServerClient, name: str, value: float) -> bool:
    try:
        return bool((_infer(client, name) == value).all())
    except InferenceServerException:
        return False


def _rows(client: httpclient.InferenceServerClient, name: str) -> list[dict[str, str]]:
    return [row for row in client.get_model_repository_index() if row["name"] == name]


@pytest.fixture()
def repository(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    _write_model(path, "edited", ADDING.format(add=1))
    return path


@pytest.fixture()
def client() -> Iterator[list[httpclient.InferenceServerClient]]:
    holder: list[httpclient.InferenceServerClient] = []
    yield holder
    for made in holder:
        made.close()


def test_a_hung_initialize_blocks_neither_the_poll_nor_other_models_nor_shutdown(
        repository: Path, client: list[httpclient.InferenceServerClient]):
    server = Backend(repository, *POLL).start()
    try:
        http = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        client.append(http)
        assert _answers(http, "edited", 2.0)
        _write_model(repository, "edited", HANGING)
        server.wait_for_log(r"loading 'edited' version 1", count=2)

        _write_model(repository, "added", ADDING.format(add=3))  # while the reload hangs
        _wait(lambda: _answers(http, "added", 4.0), "the model added during the hung reload to serve")
        assert _answers(http, "edited", 2.0)  # the old version serves on meanwhile

        _write_model(repository, "edited", ADDING.format(add=10))  # the fix supersedes the hung load
        _wait(lambda: _answers(http, "edited", 11.0), "the fixed model.py to be loaded")

        _write_model(repository, "edited", HANGING)  # hang again, then shut down in the middle
        server.wait_for_log(r"loading 'edited' version 1", count=4)
        started = time.monotonic()
        assert server.stop(timeout=30) == 0
        assert time.monotonic() - started < 30
    finally:
        server.kill()
    assert "Traceback" not in server.log()


def test_a_failed_reload_leaves_the_serving_version_restarting_from_its_own_files(
        repository: Path, client: list[httpclient.InferenceServerClient]):
    with Backend(repository, *POLL, "--backend-config=python,stub-max-restarts=2",
                 "--backend-config=python,stub-restart-window-seconds=600") as server:
        http = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        client.append(http)
        assert _answers(http, "edited", 2.0)
        _write_model(repository, "edited", FAILING)
        server.wait_for_log(r"failed to load 'edited' version 1")
        assert _answers(http, "edited", 2.0)

        [stub] = server.stub_processes()
        os.kill(stub.pid, signal.SIGKILL)  # a supervised restart, while model.py is the broken one
        server.wait_for_log(r"Stub process 'edited_0_0' restarted")
        assert _answers(http, "edited", 2.0)
        [row] = _rows(http, "edited")
        assert (row["state"], row.get("reason", "")) == ("READY", "")

        (repository / "edited" / "1" / "model.py").unlink()  # nothing on disk left to restart from
        server.wait_for_log(r"failed to load 'edited'", count=2)
        [stub] = server.stub_processes()
        os.kill(stub.pid, signal.SIGKILL)
        server.wait_for_log(r"Stub process 'edited_0_0' restarted \(restart 2")
        assert _answers(http, "edited", 2.0)

        [stub] = server.stub_processes()  # the third death in the window: the restarts give up
        os.kill(stub.pid, signal.SIGKILL)
        server.wait_for_log(r"Stub process 'edited_0_0' is FAILED")
        [row] = _rows(http, "edited")
        assert row["state"] == "UNAVAILABLE" and "SIGKILL" in row["reason"], row
        assert not _answers(http, "edited", 2.0)
