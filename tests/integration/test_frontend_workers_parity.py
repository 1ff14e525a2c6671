"""A server with `--frontend-workers 2` answers exactly as one without: the same status and the same
bytes, for the requests the core link once mangled (real servers, raw HTTP on a socket).

- ints past 64 bits in request, input and output parameters, `sequence_id`, `timeout` and
  `shared_memory_offset` (JSON has no int limit; msgpack stops at 64 bits);
- lone surrogates (`"\\ud800"` in JSON) in the request id, tensor names, parameter keys and values
  (UTF-8 cannot encode them);
- `.` and `..` in paths, which a worker's proxy must pass on as sent, not resolve.

Each case goes to both servers; the workers' core log must not show a failed link request either.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Backend, make_repository, module_backend

BIG = 2 ** 70
FAILED_IN_CORE = "a request from a frontend worker failed"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repository(tmp_path_factory.mktemp("parity"), "identity_fp32", "add_sub")


@pytest.fixture(scope="module")
def servers(repository: Path) -> Iterator[tuple[Backend, Backend]]:
    flags = ("--allow-client-shm=true",)
    with module_backend(Backend(repository, *flags, "--frontend-workers=2")) as workers, \
            module_backend(Backend(repository, *flags)) as single:
        yield workers, single


def _tensor(**extra: Any) -> dict[str, Any]:
    return {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4], **extra}


def _infer(**request: Any) -> bytes:
    return json.dumps({"inputs": [_tensor()], **request}).encode()


# (method, path, JSON body): each is sent as is to both servers
CASES: dict[str, tuple[str, str, bytes | None]] = {
    "request parameter 2^70": ("POST", "/v2/models/identity_fp32/infer", _infer(parameters={"p": BIG})),
    "request parameter -2^70": ("POST", "/v2/models/identity_fp32/infer", _infer(parameters={"p": -BIG})),
    "sequence_id 2^70": ("POST", "/v2/models/identity_fp32/infer", _infer(parameters={"sequence_id": BIG})),
    "timeout 2^70": ("POST", "/v2/models/identity_fp32/infer", _infer(parameters={"timeout": BIG})),
    "input parameter 2^70": ("POST", "/v2/models/identity_fp32/infer",
                             json.dumps({"inputs": [_tensor(parameters={"p": BIG})]}).encode()),
    "output parameter 2^70": ("POST", "/v2/models/identity_fp32/infer",
                              _infer(outputs=[{"name": "OUTPUT0", "parameters": {"p": BIG}}])),
    "shared_memory_offset 2^70": ("POST", "/v2/models/identity_fp32/infer", json.dumps({"inputs": [_tensor(
        parameters={"shared_memory_region": "nowhere", "shared_memory_byte_size": 16,
                    "shared_memory_offset": BIG})]}).encode()),
    "id with a lone surrogate": ("POST", "/v2/models/identity_fp32/infer", _infer(id="a\ud800b")),
    "input name with a lone surrogate": ("POST", "/v2/models/identity_fp32/infer",
                                         json.dumps({"inputs": [_tensor(name="IN\udfff")]}).encode()),
    "output name with a lone surrogate": ("POST", "/v2/models/identity_fp32/infer",
                                          _infer(outputs=[{"name": "OUT\ud800"}])),
    "parameter key with a lone surrogate": ("POST", "/v2/models/identity_fp32/infer",
                                            _infer(parameters={"k\ud800": 1})),
    "parameter value with a lone surrogate": ("POST", "/v2/models/identity_fp32/infer",
                                              _infer(parameters={"k": "\udfff"})),
    "model name with a lone surrogate": ("POST", "/v2/models/%ED%A0%80/infer", _infer()),
    "`..` in an infer path": ("POST", "/v2/models/x/../identity_fp32/infer", _infer()),
    "`.` in an infer path": ("POST", "/v2/models/./identity_fp32/infer", _infer()),
    "`.` in the logging path": ("POST", "/v2/./logging", b"{}"),
    "`..` in a metadata path": ("GET", "/v2/models/add_sub/../identity_fp32", None),
    "`..` above the root": ("GET", "/v2/../v2/health/ready", None),
}


def _raw(server: Backend, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
    """(status, body bytes) of the request sent exactly as written (http.client resolves nothing)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.ports["http"], timeout=60)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        connection.request(method, path, body=body, headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


@pytest.mark.parametrize("case", list(CASES))
def test_workers_answer_as_the_single_process_does(servers: tuple[Backend, Backend], case: str) -> None:
    workers, single = servers
    failed_before = workers.log().count(FAILED_IN_CORE)
    method, path, body = CASES[case]
    expected = _raw(single, method, path, body)
    assert expected[0] < 500, f"the single process answered {expected}: not a parity case"
    assert _raw(workers, method, path, body) == expected
    assert workers.log().count(FAILED_IN_CORE) == failed_before, workers.log()[-3000:]


def test_the_cases_reach_the_core(servers: tuple[Backend, Backend]) -> None:
    """Positive control: a request with a 2^70 parameter is served (200) through the workers, and a
    path with `..` is refused (404) by both: the parity above is not two identical failures."""
    workers, single = servers
    for server in (workers, single):
        status, body = _raw(server, *CASES["request parameter 2^70"])
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == [1, 2, 3, 4]
        assert _raw(server, *CASES["`..` in an infer path"])[0] == 404
