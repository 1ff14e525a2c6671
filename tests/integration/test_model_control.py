"""Model control (docs/reference/protocol.md#model-repository-extension, docs/command-line.md): explicit mode with
`--load-model`, load and unload over HTTP and gRPC with the real tritonclient, reloads, config and file overrides,
polling, invalid names, and unloading while requests are in flight."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import Backend, make_repository, module_backend
from tritonclient.utils import InferenceServerException

INVALID_NAME = "Invalid stub name: contains invalid characters"
NOT_EXPLICIT = "explicit model load / unload is not allowed if polling is enabled"

OVERRIDE_MODEL = b'''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data + 1)]))
        return out
'''
OVERRIDE_CONFIG = json.dumps({
    "name": "from_files", "backend": "python", "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
})


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("control"), "add_sub", "identity_fp32", "slow")
    with module_backend(Backend(repository, "--model-control-mode=explicit", "--load-model=add_sub",
                                "--exit-timeout-secs=2")) as server:
        yield server


def index(client: Any) -> dict[str, dict[str, str]]:
    return {row["name"]: row for row in client.get_model_repository_index()}


def add_sub(client: httpclient.InferenceServerClient, value: float = 1.0) -> np.ndarray:
    inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.full(4, value, np.float32))
    return client.infer("add_sub", inputs).as_numpy("OUTPUT0")


def override_dirs(backend: Backend) -> set[str]:
    """The override directories of this test's server (named after its pid): other servers on the
    machine make and sweep their own in the same temporary directory."""
    prefix = f"pystub_override_{backend.pid}_"
    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith(prefix)}


def raises(call: Callable[[], Any]) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value)


# -- explicit mode ---------------------------------------------------------------------------------


def test_explicit_mode_loads_only_the_named_models(http: httpclient.InferenceServerClient):
    rows = index(http)
    assert rows["add_sub"]["state"] == "READY"
    assert rows["identity_fp32"] == {"name": "identity_fp32"}  # in the repository, never loaded
    assert http.is_model_ready("add_sub") and not http.is_model_ready("identity_fp32")
    assert http.is_server_ready()
    extensions = http.get_server_metadata()["extensions"]
    assert {"model_repository", "model_repository(unload_dependents)", "logging"} <= set(extensions)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_load_and_unload(protocol: str, http: httpclient.InferenceServerClient,
                         grpc: grpcclient.InferenceServerClient):
    client: Any = http if protocol == "http" else grpc
    client.load_model("identity_fp32")
    assert http.is_model_ready("identity_fp32")
    tensor = httpclient.InferInput("INPUT0", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.arange(3, dtype=np.float32).reshape(1, 3))
    np.testing.assert_array_equal(http.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0"), [[0, 1, 2]])

    client.unload_model("identity_fp32", unload_dependents=True)
    assert not http.is_model_ready("identity_fp32")
    assert "has no available versions" in raises(lambda: http.get_model_metadata("identity_fp32"))
    assert "has no available versions" in raises(lambda: http.infer("identity_fp32", [tensor]))
    row = next(m for m in grpc.get_model_repository_index().models if m.name == "identity_fp32")
    assert (row.version, row.state, row.reason) == ("1", "UNAVAILABLE", "unloaded")
    assert http.is_server_ready()  # an unloaded model does not count against readiness
    client.unload_model("identity_fp32")  # unloading again is fine


def test_unknown_model_and_bad_parameters(http: httpclient.InferenceServerClient,
                                          grpc: grpcclient.InferenceServerClient, backend: Backend):
    assert "failed to poll from model repository" in raises(lambda: http.load_model("no_such_model"))
    assert "failed to poll from model repository" in raises(lambda: grpc.load_model("no_such_model"))
    url = f"http://{backend.http_url}/v2/repository/models/add_sub/load"
    reply = requests.post(url, json={"parameters": {"colour": "blue"}}, timeout=30)
    assert reply.status_code == 400 and "Unrecognized load parameter 'colour'" in reply.json()["error"]
    reply = requests.post(url, data=b"{not json", timeout=30)
    assert reply.status_code == 400 and "failed to parse the request JSON buffer" in reply.json()["error"]
    with pytest.raises(InferenceServerException) as info:
        grpc.load_model("add_sub", config="{\"max_batch_size\": \"many\"}")
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert http.is_model_ready("add_sub")  # a failed reload leaves the model serving


@pytest.mark.parametrize("name", ["bad;name", "bad$(x)", "it's", "a*b"])
def test_invalid_names_are_refused(name: str, http: httpclient.InferenceServerClient,
                                   grpc: grpcclient.InferenceServerClient):
    # not in the repository: a failed poll, as on Triton, whatever the name holds
    assert f"failed to load '{name}', failed to poll from model repository" in raises(lambda: http.load_model(name))
    own_config = OVERRIDE_CONFIG.replace('"from_files"', json.dumps(name))  # another name: a failed poll
    assert INVALID_NAME in raises(lambda: grpc.load_model(name, config=own_config,
                                                          files={"file:1/model.py": OVERRIDE_MODEL}))
    assert name not in index(http)


def test_reload_with_a_config_override_keeps_serving(backend: Backend, http: httpclient.InferenceServerClient,
                                                     grpc: grpcclient.InferenceServerClient):
    config = http.get_model_config("add_sub")
    config["instance_group"] = [{"count": 2, "kind": "KIND_CPU"}]
    config["parameters"] = {"reloaded": {"string_value": "yes"}}
    failures: list[str] = []
    stop = threading.Event()

    def hammer() -> None:
        client = httpclient.InferenceServerClient(backend.http_url)
        try:
            while not stop.is_set():
                try:
                    np.testing.assert_array_equal(add_sub(client), np.full(4, 2.0))
                except Exception as exc:  # noqa: BLE001 - collected and reported below
                    failures.append(str(exc))
        finally:
            client.close()

    thread = threading.Thread(target=hammer)
    thread.start()
    try:
        time.sleep(0.2)
        grpc.load_model("add_sub", config=json.dumps(config))
        time.sleep(0.2)
    finally:
        stop.set()
        thread.join(60)
    assert failures == []  # the new version was up before the old one went down
    reloaded = http.get_model_config("add_sub")
    assert reloaded["instance_group"][0]["count"] == 2
    assert reloaded["parameters"]["reloaded"]["string_value"] == "yes"
    http.load_model("add_sub")  # back to config.pbtxt
    assert "reloaded" not in http.get_model_config("add_sub").get("parameters", {})
    np.testing.assert_array_equal(add_sub(http, 3.0), np.full(4, 6.0))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_file_override_forms_a_private_model_directory(protocol: str, http: httpclient.InferenceServerClient,
                                                       grpc: grpcclient.InferenceServerClient, backend: Backend):
    client: Any = http if protocol == "http" else grpc
    before = override_dirs(backend)
    client.load_model("from_files", config=OVERRIDE_CONFIG, files={"file:1/model.py": OVERRIDE_MODEL})
    created = override_dirs(backend) - before
    assert len(created) == 1
    root = Path(tempfile.gettempdir()) / created.pop()
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert (root / "from_files" / "1" / "model.py").read_bytes() == OVERRIDE_MODEL
    tensor = httpclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.zeros(4, np.float32))
    np.testing.assert_array_equal(http.infer("from_files", [tensor]).as_numpy("OUTPUT0"), np.ones(4))
    client.unload_model("from_files")
    assert not root.exists()
    assert override_dirs(backend) - before == set()


@pytest.mark.parametrize("key", ["file:../evil.py", "file:/../evil.py", "file:1/../../evil.py", "file:",
                                 "file:1//model.py", "file:./1/model.py", "file://1/model.py"])
def test_bad_file_paths_are_refused(key: str, http: httpclient.InferenceServerClient,
                                    grpc: grpcclient.InferenceServerClient, backend: Backend):
    before = override_dirs(backend)
    for client in (http, grpc):
        text = raises(lambda c=client: c.load_model("evil", config=OVERRIDE_CONFIG, files={key: b"x = 1\n"}))
        assert f"Invalid file override '{key}'" in text
    assert override_dirs(backend) == before
    assert "evil" not in index(http)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_leading_slash_in_a_file_key_is_relative_to_the_model_directory(
        protocol: str, http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient,
        backend: Backend):
    client: Any = http if protocol == "http" else grpc
    before = override_dirs(backend)
    client.load_model("from_files", config=OVERRIDE_CONFIG, files={"file:/1/model.py": OVERRIDE_MODEL})
    created = override_dirs(backend) - before
    assert len(created) == 1
    assert (Path(tempfile.gettempdir()) / created.pop() / "from_files" / "1" / "model.py").read_bytes() == \
        OVERRIDE_MODEL
    tensor = httpclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.zeros(4, np.float32))
    np.testing.assert_array_equal(http.infer("from_files", [tensor]).as_numpy("OUTPUT0"), np.ones(4))
    client.unload_model("from_files")
    assert override_dirs(backend) == before


@pytest.mark.parametrize("config", ["name: \"someone_else\"\nbackend: \"python\"\n", "not_a_field: 1\n"],
                         ids=["names-another-model", "unreadable"])
def test_a_config_that_cannot_be_polled_fails_the_load_as_a_poll(
        config: str, backend: Backend, http: httpclient.InferenceServerClient,
        grpc: grpcclient.InferenceServerClient):
    model_dir = Path(backend.repository) / "unpollable"
    shutil.copytree(Path(backend.repository) / "identity_fp32", model_dir, dirs_exist_ok=True)
    (model_dir / "config.pbtxt").write_text(config)
    try:
        for client in (http, grpc):
            text = raises(lambda c=client: c.load_model("unpollable"))
            assert "failed to load 'unpollable', failed to poll from model repository" in text, text
        reply = requests.post(f"http://{backend.http_url}/v2/repository/models/unpollable/load", timeout=60)
        assert reply.status_code == 500  # Triton 2.51 answers a failed poll with INTERNAL
        assert index(http)["unpollable"]["state"] == "UNAVAILABLE"
        assert "failed to load 'unpollable'" in backend.log()
    finally:
        shutil.rmtree(model_dir)


def test_files_require_a_config(http: httpclient.InferenceServerClient):
    text = raises(lambda: http.load_model("from_files", files={"file:1/model.py": OVERRIDE_MODEL}))
    assert "Load parameter 'config' must be specified for model file override" in text


# -- unloading with requests in flight ---------------------------------------------------------------


def _slow_requests(pool: ThreadPoolExecutor, backend: Backend, delays: list[int]) -> list[Future[Any]]:
    """Send the requests, in order; each future holds the output or the error text."""

    def one(delay: int) -> Any:
        client = httpclient.InferenceServerClient(backend.http_url, network_timeout=120)
        try:
            tensor = httpclient.InferInput("DELAY_MS", [1], "INT32")
            tensor.set_data_from_numpy(np.array([delay], np.int32))
            return int(client.infer("slow", [tensor]).as_numpy("OUTPUT0")[0])
        except InferenceServerException as exc:
            return str(exc)
        finally:
            client.close()

    futures = []
    for delay in delays:
        futures.append(pool.submit(one, delay))
        time.sleep(0.05)  # in order: the first ones reach the stub, the last ones queue
    return futures


# The exit timeout is 2 s: two 400 ms requests drain in time, two 4 s ones do not.
@pytest.mark.parametrize("delay, timed_out", [(400, False), (4000, True)])
def test_unload_drains_in_flight_and_fails_queued(delay: int, timed_out: bool, backend: Backend,
                                                  http: httpclient.InferenceServerClient,
                                                  grpc: grpcclient.InferenceServerClient):
    grpc.load_model("slow")
    with ThreadPoolExecutor(6) as pool:
        futures = _slow_requests(pool, backend, [delay] * 6)
        time.sleep(0.3)
        started = time.monotonic()
        grpc.unload_model("slow")
        unload_seconds = time.monotonic() - started
        results = [future.result(timeout=60) for future in futures]
    queued = [r for r in results if isinstance(r, str) and "the queued request was not executed" in r]
    abandoned = [r for r in results if isinstance(r, str) and "was unloaded before the request completed" in r]
    served = [r for r in results if r == delay]
    assert len(served) + len(queued) + len(abandoned) == len(results), results
    assert queued, results
    if timed_out:
        assert abandoned and not served, results
    else:
        assert served and not abandoned, results
    assert unload_seconds < 20
    assert not http.is_model_ready("slow")
    assert index(http)["slow"]["reason"] == "unloaded"


# -- other modes -------------------------------------------------------------------------------------


def _wait(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.1)


def test_poll_mode_follows_the_repository(tmp_path: Path):
    repository = make_repository(tmp_path, "add_sub")
    bad = repository / "bad$name"
    shutil.copytree(repository / "add_sub", bad)
    with Backend(repository, "--model-control-mode=poll", "--repository-poll-secs=0.3",
                 "--exit-on-error=false") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            rows = index(client)
            assert rows["add_sub"]["state"] == "READY"
            assert rows["bad$name"]["state"] == "UNAVAILABLE" and rows["bad$name"]["reason"] == INVALID_NAME
            assert NOT_EXPLICIT in raises(lambda: client.load_model("add_sub"))
            assert NOT_EXPLICIT in raises(lambda: client.unload_model("add_sub"))
            shutil.rmtree(bad)

            make_repository(tmp_path, "identity_fp32")  # a new model directory
            _wait(lambda: client.is_model_ready("identity_fp32"))

            config = repository / "add_sub" / "config.pbtxt"
            config.write_text(config.read_text() + '\nparameters { key: "edited" value { string_value: "1" } }\n')
            _wait(lambda: "edited" in client.get_model_config("add_sub").get("parameters", {}))
            np.testing.assert_array_equal(add_sub(client), np.full(4, 2.0))

            shutil.rmtree(repository / "identity_fp32")
            _wait(lambda: index(client)["identity_fp32"].get("reason") == "unloaded")
            assert not client.is_model_ready("identity_fp32")
            assert client.is_server_ready()
        finally:
            client.close()
    log = server.log()
    assert "repository poll: reloading 'add_sub'" in log
    assert log.count("failed to load 'bad$name'") == 1  # not retried while unchanged


def test_none_mode_refuses_load_over_grpc_and_invalid_names_fail_startup(tmp_path: Path):
    repository = make_repository(tmp_path, "add_sub")
    with Backend(repository) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            with pytest.raises(InferenceServerException) as info:
                client.load_model("add_sub")
            assert NOT_EXPLICIT in str(info.value) and info.value.status() == "StatusCode.UNAVAILABLE"
        finally:
            client.close()
    shutil.copytree(repository / "add_sub", repository / "x|y")
    failing = Backend(repository, expect_exit=True).start()
    assert failing.wait_exit(60) != 0
    assert INVALID_NAME in failing.log() and "failed to load 'x|y'" in failing.log()
    failing.stop(check=False)
