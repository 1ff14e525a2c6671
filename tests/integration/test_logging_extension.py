"""The logging extension (docs/reference/protocol.md#logging-extension): settings over HTTP and gRPC, and their effect,
at once, on the backend's log and on the records of a model's `pb_utils.Logger`."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import Backend, make_repository, module_backend
from tritonclient.utils import InferenceServerException

DEFAULTS = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True, "log_verbose_level": 0,
            "log_format": "default"}
_tags = itertools.count(1)


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("logging"), "log_levels")
    with module_backend(Backend(repository, "--model-control-mode=explicit", "--load-model=*")) as server:
        yield server


@pytest.fixture(autouse=True)
def _default_settings_afterwards(http: httpclient.InferenceServerClient) -> Iterator[None]:
    yield
    http.update_log_settings({k: v for k, v in DEFAULTS.items() if k != "log_file"})


def grpc_settings(response: grpcclient.service_pb2.LogSettingsResponse) -> dict:
    return {key: getattr(value, value.WhichOneof("parameter_choice")) for key, value in response.settings.items()}


def log_records(backend: Backend, http: httpclient.InferenceServerClient, last_level: str) -> tuple[int, str]:
    """Run `log_levels` with a fresh tag; wait for its record at `last_level` (the last one the
    settings let through) and return the tag and the log lines of that tag."""
    tag = next(_tags)
    tensor = httpclient.InferInput("TAG", [1], "INT32")
    tensor.set_data_from_numpy(np.array([tag], np.int32))
    http.infer("log_levels", [tensor])
    backend.wait_for_log(rf"log_levels {last_level} tag={tag}\b")
    lines = [line for line in backend.log().splitlines() if re.search(rf"tag={tag}\b", line)]
    return tag, "\n".join(lines)


def test_round_trip_over_http_and_grpc(http: httpclient.InferenceServerClient,
                                       grpc: grpcclient.InferenceServerClient):
    assert http.get_log_settings() == DEFAULTS
    assert grpc_settings(grpc.get_log_settings()) == DEFAULTS
    assert grpc.get_log_settings(as_json=True)["settings"]["log_verbose_level"] == {"uint32_param": 0}

    updated = http.update_log_settings({"log_verbose_level": 2, "log_info": False})
    assert updated == {**DEFAULTS, "log_verbose_level": 2, "log_info": False}
    assert grpc_settings(grpc.get_log_settings()) == updated

    updated = grpc_settings(grpc.update_log_settings({"log_format": "ISO8601", "log_warning": False}))
    assert updated == {**DEFAULTS, "log_verbose_level": 2, "log_info": False, "log_format": "ISO8601",
                       "log_warning": False}
    assert http.get_log_settings() == updated  # omitted keys kept their values


@pytest.mark.parametrize("update, text", [
    ({"log_info": "yes"}, "'log_info' must be a boolean"),
    ({"log_verbose_level": -1}, "'log_verbose_level' must be an integer >= 0"),
    ({"log_verbose_level": True}, "'log_verbose_level' must be an integer >= 0"),
    ({"log_format": "xml"}, "invalid argument for --log_format, got: xml"),
    ({"log_error": False, "log_warning": 1}, "'log_warning' must be a boolean"),
])
def test_invalid_values_are_refused_and_change_nothing(update: dict, text: str, backend: Backend,
                                                       http: httpclient.InferenceServerClient):
    reply = requests.post(f"http://{backend.http_url}/v2/logging", json=update, timeout=30)
    assert reply.status_code == 400 and text in reply.json()["error"]
    assert http.get_log_settings() == DEFAULTS


def test_log_file_cannot_be_changed(backend: Backend, http: httpclient.InferenceServerClient,
                                    grpc: grpcclient.InferenceServerClient):
    text = "log file location can not be updated through network protocol"
    reply = requests.post(f"http://{backend.http_url}/v2/logging", json={"log_file": "/tmp/x.log"}, timeout=30)
    assert reply.status_code == 501 and reply.json() == {"error": text}
    with pytest.raises(InferenceServerException) as info:
        grpc.update_log_settings({"log_file": "/tmp/x.log", "log_info": False})
    assert info.value.status() == "StatusCode.UNIMPLEMENTED" and text in str(info.value)
    assert http.get_log_settings() == DEFAULTS


def test_settings_gate_model_records_at_once(backend: Backend, http: httpclient.InferenceServerClient):
    _, lines = log_records(backend, http, "error")
    assert "log_levels info" in lines and "log_levels warning" in lines and "verbose" not in lines
    assert re.search(r"^I\d{4} [\d:.]+ \d+ model\.py:\d+\] \[log_levels_0\] log_levels info", lines, re.M)

    http.update_log_settings({"log_verbose_level": 1})
    _, lines = log_records(backend, http, "error")
    assert "log_levels verbose" in lines  # VERBOSE needs log_verbose_level >= 1

    http.update_log_settings({"log_verbose_level": 0, "log_info": False, "log_error": False})
    _, lines = log_records(backend, http, "warning")
    assert len(lines.splitlines()) == 1 and "log_levels warning" in lines

    http.update_log_settings({"log_info": True, "log_error": True, "log_format": "ISO8601"})
    _, lines = log_records(backend, http, "error")
    assert re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ E \d+ model\.py:\d+\] .*log_levels error", lines, re.M)


def test_backend_records_follow_the_settings(backend: Backend, http: httpclient.InferenceServerClient):
    loaded = "successfully loaded 'log_levels' version 1"
    failed = "failed to load 'no_such_model'"
    before = backend.log().count(loaded)
    http.update_log_settings({"log_info": False, "log_error": False})
    http.load_model("log_levels")  # a reload: INFO records
    with pytest.raises(InferenceServerException):
        http.load_model("no_such_model")  # an ERROR record
    http.update_log_settings({"log_info": True, "log_error": True})
    http.load_model("log_levels")
    with pytest.raises(InferenceServerException):
        http.load_model("no_such_model")
    backend.wait_for_log(failed)
    assert backend.log().count(loaded) == before + 1
    assert backend.log().count(failed) == 1
