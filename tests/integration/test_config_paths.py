"""Paths taken from a model config stay inside the model directory, on a real backend.

A planted `model.py` outside the repository writes a marker file when it is imported: a load that
would run it (auto-complete imports it in a throw-away stub, an instance imports it) leaves the
marker, so "refused" here means the file never ran, not only that the load answered 400.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import EXAMPLES, Backend, make_repository, module_backend

IDENTITY = (EXAMPLES / "identity_fp32" / "1" / "model.py").read_text()


def _load(backend: Backend, name: str, parameters: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"parameters": parameters or {}}).encode()
    call = urllib.request.Request(f"http://{backend.http_url}/v2/repository/models/{name}/load", data=body,
                                  method="POST")
    try:
        with urllib.request.urlopen(call, timeout=60) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """/elsewhere: a model file that leaves a marker next to itself when it is imported."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (elsewhere / "model.py").write_text(f"open({str(elsewhere / 'RAN')!r}, 'w').close()\n" + IDENTITY)
    env = elsewhere / "env" / "bin"
    env.mkdir(parents=True)
    (env / "activate").write_text(f"touch {elsewhere / 'RAN'}\n")
    return elsewhere


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory, planted: Path) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("paths"), "identity_fp32")
    for name in ("abs_name", "dotdot_name", "linked_out", "linked_in", "env_out"):
        shutil.copytree(repository / "identity_fp32", repository / name)
        (repository / name / "config.pbtxt").write_text(
            (repository / "identity_fp32" / "config.pbtxt").read_text().replace("identity_fp32", name))
    os.remove(repository / "linked_out" / "1" / "model.py")
    os.symlink(planted / "model.py", repository / "linked_out" / "1" / "model.py")
    os.rename(repository / "linked_in" / "1" / "model.py", repository / "linked_in" / "shared.py")
    os.symlink("../shared.py", repository / "linked_in" / "1" / "model.py")
    with module_backend(Backend(repository, "--model-control-mode=explicit")) as server:
        yield server


def _config(name: str, **fields: Any) -> str:
    config = {"name": name, "backend": "python", "max_batch_size": 8,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}
    return json.dumps({**config, **fields})


@pytest.mark.parametrize("name, filename, why", [
    ("abs_name", "ABSOLUTE", "no absolute path"),
    ("dotdot_name", "../../elsewhere/model.py", "no '..'"),
])
def test_default_model_filename_outside_is_refused(backend: Backend, planted: Path, name: str, filename: str,
                                                   why: str) -> None:
    filename = str(planted / "model.py") if filename == "ABSOLUTE" else filename
    status, reply = _load(backend, name, {"config": _config(name, default_model_filename=filename)})
    assert status == 400, reply
    assert f"default_model_filename '{filename}'" in reply["error"] and why in reply["error"], reply
    assert not (planted / "RAN").exists(), "the file outside the model directory was run"


def test_a_model_file_linking_out_is_refused(backend: Backend, planted: Path) -> None:
    status, reply = _load(backend, "linked_out")
    assert status == 400 and "leads outside the model directory" in reply["error"], reply
    assert not (planted / "RAN").exists(), "the file outside the model directory was run"


def test_a_model_file_linking_inside_loads(backend: Backend) -> None:
    status, reply = _load(backend, "linked_in")
    assert status == 200, reply


def test_a_requested_execution_env_outside_is_refused(backend: Backend, planted: Path) -> None:
    parameters = {"EXECUTION_ENV_PATH": {"string_value": str(planted / "env")}}
    status, reply = _load(backend, "env_out", {"config": _config("env_out", parameters=parameters)})
    assert status == 400 and "EXECUTION_ENV_PATH" in reply["error"], reply
    assert not (planted / "RAN").exists(), "the environment outside the model directory was activated"
