"""Load parameters and override directories (pystub_backend.backend.models.overrides), and how the HTTP and gRPC
frontends decode them."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest
from tritonclient.grpc import service_pb2

from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.frontends.grpc.codec import (
    log_settings_from_proto,
    log_settings_to_proto,
    repository_parameters,
)
from pystub_backend.backend.frontends.http.control import load_parameters
from pystub_backend.backend.models.overrides import OverrideDir, override_file_path, parse_load_parameters


def test_config_and_files():
    request = parse_load_parameters({"config": "{}", "file:1/model.py": b"x", "file:1/lib/util.py": bytearray(b"y")})
    assert request.config == "{}"
    assert request.files == {"file:1/model.py": b"x", "file:1/lib/util.py": b"y"}
    assert parse_load_parameters({}).config is None
    assert parse_load_parameters({"config": ""}).config is None  # pb_utils.load_model's default


@pytest.mark.parametrize("parameters, text", [
    ({"file:1/model.py": b"x"}, "Load parameter 'config' must be specified for model file override"),
    ({"config": 3}, "'config' must be a string"),
    ({"config": "{}", "file:1/model.py": "eA=="}, "must carry the file content as bytes"),
    ({"colour": "blue"}, "Unrecognized load parameter 'colour'"),
])
def test_bad_parameters(parameters, text):
    with pytest.raises(ServerError) as info:
        parse_load_parameters(parameters)
    assert info.value.status == Status.INVALID_ARG and text in info.value.message


@pytest.mark.parametrize("key", ["file:", "file:/", "file://etc/passwd", "file:/../x", "file:../x", "file:1/../../x",
                                 "file:1/..",
                                 "file:1//x", "file:./x", "file:1/", "file:a\0b"])
def test_unsafe_paths(key):
    with pytest.raises(ServerError) as info:
        override_file_path(key)
    assert f"Invalid file override '{key}'" in info.value.message
    with pytest.raises(ServerError):
        parse_load_parameters({"config": "{}", key: b""})


@pytest.mark.parametrize("key", ["file:1/model.py", "file:/1/model.py"])
def test_a_leading_slash_means_the_model_directory(key: str):
    assert override_file_path(key) == "1/model.py"


def test_override_dir_is_private_and_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    directory = OverrideDir.create("m", {"file:1/model.py": b"code", "file:1/sub/data.bin": b"\0\1"})
    root = Path(directory.root)
    assert root.parent == tmp_path and Path(directory.model_dir) == root / "m"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert (root / "m" / "1" / "model.py").read_bytes() == b"code"
    assert (root / "m" / "1" / "sub" / "data.bin").read_bytes() == b"\0\1"
    assert stat.S_IMODE((root / "m" / "1" / "model.py").stat().st_mode) == 0o600
    directory.remove()
    directory.remove()
    assert not root.exists()


def test_override_dir_conflicting_files_leave_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with pytest.raises(ServerError) as info:
        OverrideDir.create("m", {"file:1": b"a file", "file:1/model.py": b"below it"})
    assert "Invalid file override 'file:1/model.py'" in info.value.message
    assert os.listdir(tmp_path) == []


def test_http_load_parameters_decode_base64():
    body = json.dumps({"parameters": {"config": "{}", "file:1/model.py": base64.b64encode(b"code").decode()}})
    assert load_parameters(body.encode()) == {"config": "{}", "file:1/model.py": b"code"}
    assert load_parameters(b"") == {}
    for bad in (b'{"parameters": {"file:1/m.py": "not base64!"}}', b'{"parameters": {"file:1/m.py": 1}}',
                b'{"parameters": []}', b"[]", b"{"):
        with pytest.raises(ServerError) as info:
            load_parameters(bad)
        assert info.value.status == Status.INVALID_ARG


def test_grpc_repository_parameters():
    request = service_pb2.RepositoryModelLoadRequest(model_name="m")
    request.parameters["config"].string_param = "{}"
    request.parameters["file:1/model.py"].bytes_param = b"code"
    request.parameters["unload_dependents"].bool_param = True
    request.parameters["unset"].CopyFrom(service_pb2.ModelRepositoryParameter())
    assert repository_parameters(request.parameters) == {"config": "{}", "file:1/model.py": b"code",
                                                         "unload_dependents": True}


def test_grpc_log_settings():
    request = service_pb2.LogSettingsRequest()
    request.settings["log_info"].bool_param = False
    request.settings["log_verbose_level"].uint32_param = 2
    request.settings["log_format"].string_param = "ISO8601"
    request.settings["log_file"]  # present but unset: unchanged
    assert log_settings_from_proto(request.settings) == {"log_info": False, "log_verbose_level": 2,
                                                         "log_format": "ISO8601"}
    response = log_settings_to_proto({"log_file": "", "log_info": True, "log_verbose_level": 1})
    assert response.settings["log_file"].string_param == ""
    assert response.settings["log_info"].bool_param is True
    assert response.settings["log_verbose_level"].uint32_param == 1


def test_stale_override_dirs_of_dead_servers_are_swept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import subprocess
    import sys

    from pystub_backend.backend.models.overrides import sweep_stale_override_dirs
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"pystub_override_{int(dead.stdout)}_abc"
    stale.mkdir()
    (stale / "m").mkdir()
    mine = OverrideDir.create("m", {"file:1/model.py": b""})
    other = tmp_path / "pystub_override_notapid"
    other.mkdir()
    assert sweep_stale_override_dirs() == [str(stale)]
    assert not stale.exists() and Path(mine.root).exists() and other.exists()
    mine.remove()
