"""Loading a repository: configs, auto-complete, instance groups, load failures, and shutdown."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import Backend, make_repository
from tritonclient.utils import InferenceServerException


def infer_int32(url: str, model: str, name: str, value: int, output: str) -> np.ndarray:
    client = httpclient.InferenceServerClient(url)
    try:
        tensor = httpclient.InferInput(name, [1], "INT32")
        tensor.set_data_from_numpy(np.array([value], np.int32))
        return client.infer(model, [tensor]).as_numpy(output)
    finally:
        client.close()


@pytest.mark.parametrize("model, texts", [
    ("no_model_file", ["Failed to preinitialize Python stub: Python model file not found in '",
                       "no_model_file/1/model.py'", "failed to load 'no_model_file'"]),
    ("syntax_error", ["failed to load 'syntax_error'", "SyntaxError"]),
    ("init_raises", ["failed to load 'init_raises'", "name 'x' is not defined", "Traceback"]),
    ("bad_config", ["config.pbtxt", "3:1", "not_a_field", "failed to load 'bad_config'"]),
])
def test_load_failure_exits_nonzero_with_the_reason(tmp_path: Path, model: str, texts: list[str]):
    backend = Backend(make_repository(tmp_path, "add_sub", model), expect_exit=True).start()
    code = backend.wait_exit(60)
    log = backend.log()
    assert code != 0, log
    for text in texts:
        assert text in log
    assert backend.shm_entries() == []
    backend.stop(check=False)


def test_exit_on_error_false_serves_the_other_models(tmp_path: Path):
    repository = make_repository(tmp_path, "add_sub", "init_raises", "no_model_file")
    with Backend(repository, "--exit-on-error=false") as backend:
        client = httpclient.InferenceServerClient(backend.http_url)
        try:
            index = {row["name"]: row for row in client.get_model_repository_index()}
            assert index["add_sub"]["state"] == "READY"
            assert index["init_raises"]["state"] == "UNAVAILABLE"
            assert "name 'x' is not defined" in index["init_raises"]["reason"]
            assert not client.is_model_ready("init_raises")
            assert client.is_model_ready("add_sub")
            assert not client.is_server_ready()  # strict readiness: a model is not ready
            data = np.ones(4, np.float32)
            inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(data)
            np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), data * 2)
        finally:
            client.close()


def test_auto_complete_without_config_file(tmp_path: Path):
    with Backend(make_repository(tmp_path, "auto_complete")) as backend:
        client = grpcclient.InferenceServerClient(backend.grpc_url)
        try:
            config = client.get_model_config("auto_complete").config
            assert config.max_batch_size == 4 and config.input[0].name == "IN"
            tensor = grpcclient.InferInput("IN", [3, 2], "INT64")
            tensor.set_data_from_numpy(np.arange(6, dtype=np.int64).reshape(3, 2))
            result = client.infer("auto_complete", [tensor]).as_numpy("OUT")
            np.testing.assert_array_equal(result, np.arange(6).reshape(3, 2) * 2)
        finally:
            client.close()


def test_default_model_filename_and_sibling_imports(tmp_path: Path):
    with Backend(make_repository(tmp_path, "custom_filename")) as backend:
        client = httpclient.InferenceServerClient(backend.http_url)
        try:
            tensor = httpclient.InferInput("INPUT0", [1], "FP32")
            tensor.set_data_from_numpy(np.array([41], np.float32))
            assert client.infer("custom_filename", [tensor]).as_numpy("OUTPUT0").tolist() == [42]
        finally:
            client.close()


def test_instance_group_and_initialize_args(tmp_path: Path):
    repository = make_repository(tmp_path, "args_echo")
    with Backend(repository) as backend:
        stubs = backend.stub_processes()
        assert len(stubs) == 2
        seen = {}
        for _ in range(20):
            args = json.loads(infer_int32(backend.http_url, "args_echo", "INPUT0", 0, "ARGS")[0])
            seen[args["model_instance_name"]] = args
            if len(seen) == 2:
                break
        args = seen.get("args_echo_0_0") or next(iter(seen.values()))
    assert set(args) - {"pid", "sys_path_tail", "module"} == {
        "model_config", "model_instance_kind", "model_instance_name", "model_instance_device_id",
        "model_repository", "model_version", "model_name"}
    assert args["model_name"] == "args_echo" and args["model_version"] == "1"
    assert args["model_instance_kind"] == "CPU" and args["model_instance_device_id"] == "0"
    assert args["model_repository"] == str(repository / "args_echo")
    assert args["module"] == "1.model"
    assert args["sys_path_tail"][:2] == [str(repository / "args_echo" / "1"), str(repository / "args_echo")]
    config = json.loads(args["model_config"])
    assert config["max_batch_size"] == 0 and config["input"][0]["dims"] == [1]
    assert config["parameters"] == {"greeting": {"string_value": "hello"}}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_shutdown_finalizes_and_cleans_up(tmp_path: Path, sig: int):
    backend = Backend(make_repository(tmp_path, "slow", "add_sub")).start()
    assert backend.shm_entries() == []  # the arenas are anonymous (memfd): nothing to clean by name
    stubs = backend.stub_processes()
    assert len(stubs) == 2
    code = backend.stop(sig=sig)  # checks exit status 0 and an empty /dev/shm
    assert code == 0
    log = backend.log()
    assert "slow: finalize called" in log and "add_sub: finalize" in log
    assert all(not stub.is_running() for stub in stubs)


def test_shutdown_finishes_in_flight_requests(tmp_path: Path):
    backend = Backend(make_repository(tmp_path, "slow")).start()
    outcome: dict[str, object] = {}

    def call() -> None:
        try:
            outcome["value"] = infer_int32(backend.http_url, "slow", "DELAY_MS", 1500, "OUTPUT0").tolist()
        except InferenceServerException as error:
            outcome["error"] = error.message()

    worker = threading.Thread(target=call)
    worker.start()
    time.sleep(0.5)  # the request is inside execute now
    backend.stop()
    worker.join(30)
    assert outcome.get("value") == [1500], outcome
