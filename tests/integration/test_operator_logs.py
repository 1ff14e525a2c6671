"""What an operator reads in the log: load start and ready lines
with the load time, a busy port reported before any model loads, per-request access lines at
`--log-verbose 1`, `--log-format json`, and client text escaped in every format."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from harness import Backend, make_repository

# What a client may try to smuggle into a log line: a forged record and a terminal escape.
HOSTILE = "evil\r\nE1124 00:00:00.000000 1 forged.py:1] injected\x1b[31mred\x1b]0;title\x07\u2028"


def _raw_controls(text: str) -> list[str]:
    """Control characters in `text` other than the line feeds between records."""
    return sorted({char for char in text if (ord(char) < 0x20 and char != "\n") or 0x7F <= ord(char) < 0xA0
                   or char in "\u2028\u2029"})


def _slow_repository(tmp_path: Path, seconds: float) -> Path:
    repository = make_repository(tmp_path, "slow_init")
    config = repository / "slow_init" / "config.pbtxt"
    config.write_text(config.read_text().replace('string_value: "6"', f'string_value: "{seconds:g}"'))
    return repository


def test_a_slow_initialize_shows_its_start_at_once_and_its_ready_line_with_the_load_time(tmp_path: Path) -> None:
    """Decided on the log's own timestamps, not on wall-clock bounds that a loaded machine's
    start-up could break: the start line is written when loading starts, 6 s before the end."""
    backend = Backend(_slow_repository(tmp_path, 6), expect_exit=True)
    backend.args += ["--http-port=0", "--grpc-port=0", "--metrics-port=0"]
    backend.start()
    try:
        backend.wait_for_log(r"loading 'slow_init' version 1", timeout=60.0)
        assert "successfully loaded 'slow_init'" not in backend.log()  # seen while initialize still runs
        ready = backend.wait_for_log(r"successfully loaded 'slow_init' version 1 in ([\d.]+) s", timeout=60.0)
        assert 6.0 <= float(ready.group(1)) < 30.0, ready.group(0)
        times = {word: stamp for stamp, word in re.findall(
            r"^I\d{4} (\d\d:\d\d:\d\d\.\d{6}) \d+ lifecycle\.py:\d+\] (loading|successfully) ", backend.log(), re.M)}
        assert _seconds(times["successfully"]) - _seconds(times["loading"]) >= 5.9, times
    finally:
        assert backend.stop() == 0


def _seconds(stamp: str) -> float:
    hours, minutes, seconds = stamp.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        yield holder.getsockname()[1]


@pytest.mark.parametrize("listener", ["http", "grpc", "metrics"])
def test_a_busy_port_is_reported_before_any_model_loads(tmp_path: Path, busy_port: int, listener: str) -> None:
    ports = {name: 0 for name in ("http", "grpc", "metrics")} | {listener: busy_port}
    backend = Backend(_slow_repository(tmp_path, 6), *(f"--{name}-port={port}" for name, port in ports.items()),
                      expect_exit=True)
    started = time.monotonic()
    backend.start()
    try:
        assert backend.wait_exit(timeout=30.0) == 1
        took = time.monotonic() - started
        log_text = backend.log()
        label = {"http": "HTTP", "grpc": "gRPC", "metrics": "metrics"}[listener]
        assert f"failed to start a listener: {label} port 127.0.0.1:{busy_port} cannot be bound" in log_text
        # No model started (the 6 s initialize never ran): the decisive check, whatever the machine's load.
        assert "loading 'slow_init'" not in log_text and "Started " not in log_text, log_text
        assert took < 30.0, log_text
    finally:
        backend.stop(check=False)


def _infer_http(backend: Backend, model: str, request_id: str) -> tuple[int, str]:
    body = {"id": request_id, "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    with requests.post(f"http://{backend.http_url}/v2/models/{requests.utils.quote(model, safe='')}/infer",
                       json=body, timeout=30, headers={"Connection": "close"}) as response:
        return response.status_code, response.text


def _json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_access_lines_in_json_with_client_text_escaped(tmp_path: Path) -> None:
    repository = _slow_repository(tmp_path, 0)
    with Backend(repository, "--log-format=json", "--log-verbose=1") as backend:
        status, text = _infer_http(backend, "slow_init", "req-1")
        assert status == 200 and json.loads(text)["outputs"][0]["data"] == [1.0], text
        assert _infer_http(backend, HOSTILE, HOSTILE)[0] == 400  # name refused (control characters); the path is logged
        client = grpcclient.InferenceServerClient(backend.grpc_url)
        try:
            tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
            tensor.set_data_from_numpy(np.array([2.0], dtype=np.float32))
            client.infer("slow_init", [tensor], request_id=HOSTILE)
        finally:
            client.close()
        backend.wait_for_log(r'"method": "ModelInfer"', timeout=10.0)
        text = backend.log()
    assert _raw_controls(text) == [], "raw control characters reached the log"
    records = _json_lines(text)  # every line is one JSON object
    assert all({"time", "level", "pid", "file", "message"} <= set(record) for record in records)
    loaded = next(r for r in records if str(r["message"]).startswith("successfully loaded 'slow_init'"))
    assert loaded["model"] == "slow_init" and loaded["version"] == 1 and loaded["level"] == "INFO"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", str(loaded["time"]))
    access = [r for r in records if str(r["file"]).startswith("access_log.py:")]
    good = next(r for r in access if r.get("request_id") == "req-1")
    assert good["method"] == "POST /v2/models/slow_init/infer" and good["status"] == "200"
    assert good["model"] == "slow_init" and good["peer"] == "127.0.0.1" and float(str(good["duration_ms"])) > 0
    hostile_http = next(r for r in access if r["status"] == "400")
    assert hostile_http["model"] == HOSTILE  # intact once decoded: JSON escaped it, nothing was lost
    hostile_grpc = next(r for r in access if r["method"] == "ModelInfer")
    assert hostile_grpc["request_id"] == HOSTILE and hostile_grpc["status"] == "OK"


@pytest.mark.parametrize("log_format", ["default", "ISO8601"])
def test_text_formats_escape_client_text_and_keep_one_record_per_line(tmp_path: Path, log_format: str) -> None:
    repository = _slow_repository(tmp_path, 0)
    with Backend(repository, f"--log-format={log_format}", "--log-verbose=1",
                 "--model-control-mode=explicit", "--load-model=slow_init") as backend:
        _infer_http(backend, HOSTILE, HOSTILE)
        with requests.post(f"http://{backend.http_url}/v2/repository/models/{requests.utils.quote(HOSTILE, safe='')}"
                           "/load", timeout=30, headers={"Connection": "close"}) as response:
            assert response.status_code == 400  # refused: not a model name
        backend.wait_for_log(r"access_log\.py.*/load 400 ", timeout=10.0)
        text = backend.log()
    assert _raw_controls(text) == []
    head = r"^I\d{4} [\d:.]+ \d+ " if log_format == "default" else r"^\d{4}-\d\d-\d\dT[\d:]+Z [IWE] \d+ "
    forged = [line for line in text.splitlines() if "injected" in line]
    assert forged, text
    for line in forged:  # the hostile text stays inside a record whose head is the server's own
        assert re.match(head.replace("^I", "^[IWE]"), line) and "forged.py:1] injected" in line
        assert "evil\\r\\nE1124" in line and "\\x1b[31mred" in line and "\\x07" in line and "\\u2028" in line
    assert not any(line.startswith("E1124 00:00:00") for line in text.splitlines())


def test_no_access_lines_below_verbose_1(tmp_path: Path) -> None:
    with Backend(_slow_repository(tmp_path, 0)) as backend:
        assert _infer_http(backend, "slow_init", "quiet")[0] == 200
        with requests.post(f"http://{backend.http_url}/v2/logging", json={"log_verbose_level": 1}, timeout=10,
                           headers={"Connection": "close"}) as response:
            assert response.status_code == 200, response.text
        assert _infer_http(backend, "slow_init", "loud")[0] == 200
        backend.wait_for_log(r"id=loud", timeout=10.0)
        text = backend.log()
    assert "id=quiet" not in text and "access_log.py" in text
