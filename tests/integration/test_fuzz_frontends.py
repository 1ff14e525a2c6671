"""Fuzzing the HTTP and gRPC frontends of a real server, as one process and with
`--frontend-workers 2`.

One module-scoped backend (per variant) serves the fuzz models (examples plus `identity_2d`) with client shared
memory on and one registered region, so shared-memory parameters that point anywhere meet a real
registry. Every outcome must be a valid response or a refusal: HTTP 4xx with `{"error": <why>}`
(501 only for an unknown `Content-Encoding`), gRPC INVALID_ARGUMENT / NOT_FOUND (UNKNOWN only
from grpcio itself, for bytes that are not a protobuf). Never a 5xx from our code, a crash, a
restarted stub or a hang: at the end every model still answers correctly, no stub restarted or
holds a request, and the log shows no unexpected exception.
"""

from __future__ import annotations

import http.client as httplib
import json
import mmap
import os
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from fuzz_cases import (
    MODELS,
    GrpcCase,
    HttpCase,
    grpc_bytes,
    grpc_request,
    http_case,
    json_values,
    make_fuzz_repository,
    scaled,
    texts,
)
from harness import Backend, module_backend
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2, service_pb2_grpc

SETTINGS = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))
# Oversize-metadata cases (a 300 KB id) make hypothesis warn about the size of a failing case's
# repr; the warning is about the report, not the server.
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")
TIMEOUT = 15.0  # per request: a hang fails the case instead of the whole run
REGION_BYTES = 64
# What the log of a server that handled bad input well never shows.
UNEXPECTED_LOG = ("Traceback", "Exception in callback", "Task exception was never retrieved",
                  "HTTP POST", "HTTP GET", "gRPC ModelInfer failed", "is not healthy",
                  "a request from a frontend worker failed", "closing the core link")
# The server runs as one process, and with frontend workers (protocol work in two worker
# processes, inference over the core link): both must take every case as well. Each variant runs
# half the examples one server used to take, so the two together send as many; tools/fuzz.py
# scales them up for long runs.
VARIANTS = {"single-process": (), "frontend-workers-2": ("--frontend-workers=2",)}


@pytest.fixture(scope="module")
def region() -> Iterator[str]:
    """A client shm object the fuzzed requests may name (registered as region 'fuzz')."""
    key = f"/fuzz_region_{os.getpid()}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_RDWR | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, REGION_BYTES)
        with mmap.mmap(fd, REGION_BYTES) as mapping:
            mapping[:] = np.arange(REGION_BYTES // 4, dtype=np.float32).tobytes()
    finally:
        os.close(fd)
    yield key
    os.unlink(f"/dev/shm{key}")


@pytest.fixture(scope="module", params=list(VARIANTS))
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, region: str) -> Iterator[Backend]:
    repository = make_fuzz_repository(tmp_path_factory.mktemp("fuzz"))
    with module_backend(Backend(repository, "--allow-client-shm=true", *VARIANTS[request.param])) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            client.register_system_shared_memory("fuzz", region, REGION_BYTES)
        finally:
            client.close()
        yield server
        check_still_serving(server)


@pytest.fixture()
def connection(backend: Backend) -> Iterator[httplib.HTTPConnection]:
    host, port = backend.http_url.split(":")
    opened = httplib.HTTPConnection(host, int(port), timeout=TIMEOUT)
    yield opened
    opened.close()


@pytest.fixture()
def channel(backend: Backend) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(backend.grpc_url) as opened:
        yield opened


def post(connection: httplib.HTTPConnection, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, Any]:
    """POST and read the answer; once more on a fresh connection if the server had closed it (it
    may close a connection after a refusal, as HTTP allows)."""
    raw_headers = {key: value.encode("utf-8", "surrogateescape") for key, value in headers.items()}
    for attempt in (1, 2):
        try:
            connection.request("POST", path, body=body, headers=raw_headers)
            response = connection.getresponse()
            return response.status, response.read(), response.headers
        except (httplib.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            connection.close()
            if attempt == 2:
                raise
        except BaseException:
            connection.close()  # a half-sent request leaves the connection unusable
            raise
    raise AssertionError("unreachable")


def check_http_outcome(status: int, payload: bytes, headers: Any, case: HttpCase) -> None:
    if status == 200:
        length = headers.get("Inference-Header-Content-Length")
        header = payload[:int(length)] if length is not None else payload
        # BYTES outputs that are not UTF-8 go into the JSON verbatim, as in Triton (json_tensors)
        document = json.loads(header.decode("utf-8", "surrogateescape"))
        assert document["model_name"] == case.model and document["outputs"], document
        return
    assert status < 500 or (status == 501 and case.encoding), (status, payload[:300], case)
    error = json.loads(payload)["error"]
    assert isinstance(error, str) and error, payload


@settings(max_examples=scaled(500), **SETTINGS)
@given(case=http_case())
def test_http_infer_answers_or_refuses(connection: httplib.HTTPConnection, case: HttpCase) -> None:
    headers = {"Content-Type": "application/octet-stream"}
    if case.header_length is not None:
        headers["Inference-Header-Content-Length"] = case.header_length
    if case.encoding is not None:
        headers["Content-Encoding"] = case.encoding
    status, payload, reply_headers = post(connection, f"/v2/models/{case.model}/infer", case.body, headers)
    if case.kind == "valid":
        assert status == 200, (status, payload[:300], case)
    check_http_outcome(status, payload, reply_headers, case)


_SHM_REGISTER = st.fixed_dictionaries({}, optional={
    "key": st.one_of(st.sampled_from(["/", "/..", "/a/b", "../x", "/pystub_1_x_ctl", "/dev/null", "//etc/passwd",
                                      "/nonexistent"]), st.text(max_size=12)),
    "offset": st.one_of(st.integers(-(2**64), 2**64), st.text(max_size=3)),
    "byte_size": st.one_of(st.integers(-(2**64), 2**64), st.none()),
})


@settings(max_examples=scaled(75), **SETTINGS)
@given(body=_SHM_REGISTER, name=st.text(min_size=1, max_size=8).filter(lambda n: "/" not in n and n.isprintable()))
def test_shared_memory_registration_answers_or_refuses(connection: httplib.HTTPConnection, region: str,
                                                       body: dict[str, Any], name: str) -> None:
    path = f"/v2/systemsharedmemory/region/{quote(name, safe='')}"
    status, payload, _ = post(connection, path + "/register", json.dumps(body).encode(), {})
    assert status in (200, 400, 404), (status, payload, body)
    if status != 200:
        assert json.loads(payload)["error"]
    else:  # only a real object of the right size can be registered: ours
        assert body.get("key") in (region, region.lstrip("/")), body
        status, payload, _ = post(connection, path + "/unregister", b"", {})
        assert status == 200, payload


@pytest.fixture(scope="module")
def shrinking_region(backend: Backend) -> Iterator[str]:
    """A client shm object registered as region 'shrinking', whose owner truncates it."""
    key = f"/fuzz_shrinking_{os.getpid()}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_RDWR | os.O_EXCL, 0o600)
    os.close(fd)
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        os.truncate(f"/dev/shm{key}", REGION_BYTES)
        client.register_system_shared_memory("shrinking", key, REGION_BYTES)
        yield key
        client.unregister_system_shared_memory("shrinking")
    finally:
        client.close()
        os.unlink(f"/dev/shm{key}")


@settings(max_examples=scaled(75), **SETTINGS)
@given(size=st.integers(0, REGION_BYTES), offset=st.integers(0, REGION_BYTES), nbytes=st.integers(0, REGION_BYTES),
       model=st.sampled_from(["identity_fp32", "string_identity"]), output=st.booleans())
def test_a_region_truncated_by_its_owner_answers_or_refuses(connection: httplib.HTTPConnection,
                                                            shrinking_region: str, size: int, offset: int,
                                                            nbytes: int, model: str, output: bool) -> None:
    """The owner shrinks the object, then a request names bytes of it (as input, or as the output's
    destination): 200 or 400, never a dead backend or stub (check_still_serving counts restarts)."""
    os.truncate(f"/dev/shm{shrinking_region}", size)
    try:
        datatype = "FP32" if model == "identity_fp32" else "BYTES"
        shm = {"shared_memory_region": "shrinking", "shared_memory_byte_size": nbytes, "shared_memory_offset": offset}
        shape = [1, max(nbytes // 4, 1)] if datatype == "FP32" else [1]
        document: dict[str, Any] = {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": shape,
                                                "parameters": shm}]}
        if output:  # the input travels in the body, the output goes to the shrunk region
            document["inputs"][0] = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}
            document["outputs"] = [{"name": "OUTPUT0", "parameters": shm}]
            model = "identity_fp32"
        status, payload, _ = post(connection, f"/v2/models/{model}/infer", json.dumps(document).encode(), {})
        assert status in (200, 400), (status, payload[:300], size, document)
    finally:
        os.truncate(f"/dev/shm{shrinking_region}", REGION_BYTES)


_GENERATE_BODIES = st.one_of(
    st.dictionaries(st.one_of(st.sampled_from(["INPUT0", "INPUT1", "parameters", "id", "timeout", "priority"]),
                              texts), json_values, max_size=4),
    json_values)
_PATHS = st.one_of(
    st.sampled_from(["%2e%2e", "..", "a/../add_sub", "add_sub%00", "add_sub/versions/-1", "add_sub/versions/1",
                     "add_sub/versions/99999999999999999999", "x" * 300, "%ff%fe", "add_sub;rm", "add_sub%2Fconfig"]),
    st.text(min_size=1, max_size=12).map(lambda t: quote(t, safe="")))


@settings(max_examples=scaled(150), **SETTINGS)
@given(model=st.sampled_from(sorted(MODELS)), document=_GENERATE_BODIES, path=st.none() | _PATHS,
       route=st.sampled_from(["generate", "infer", "ready", "config", "stats"]))
def test_generate_and_model_routes_answer_or_refuse(connection: httplib.HTTPConnection, model: str, document: Any,
                                                    path: str | None, route: str) -> None:
    body = json.dumps(document).encode()
    target = f"/v2/models/{path or model}/{route}"
    if route in ("ready", "config", "stats"):
        connection.request("GET", target)
        response = connection.getresponse()
        status, payload = response.status, response.read()
    else:
        status, payload, _ = post(connection, target, body, {})
    assert status in (200, 400, 404, 405), (status, payload[:300], target, body[:200])
    if status != 200 and payload:
        assert json.loads(payload)["error"], payload


_JSON_ROUTES = ["/v2/models/identity_fp32/infer", "/v2/models/identity_fp32/generate",
                "/v2/models/identity_fp32/generate_stream", "/v2/repository/index", "/v2/logging",
                "/v2/systemsharedmemory/region/nest/register"]
DEEP_ERROR = "failed to parse the request JSON buffer: nesting deeper than 128 levels"


@st.composite
def nested_json(draw: st.DrawFn) -> bytes:
    """JSON nested 1..100,000 deep: arrays, objects or a cycle of both, closed or cut
    anywhere, bare or inside a request document."""
    depth = draw(st.one_of(st.integers(1, 140), st.integers(141, 3000), st.just(100_000)))
    pattern = draw(st.lists(st.sampled_from([b"[", b'{"a":']), min_size=1, max_size=4))
    openers = [pattern[i % len(pattern)] for i in range(depth)]
    closers = [b"]" if opener == b"[" else b"}" for opener in reversed(openers)]
    body = b"".join(openers) + draw(st.sampled_from([b"1", b'"x"', b"[]", b""])) + b"".join(closers)
    cut = draw(st.one_of(st.none(), st.integers(0, len(body))))
    body = body if cut is None else body[:cut]
    return b'{"inputs":' + body + b"}" if draw(st.booleans()) else body


@settings(max_examples=scaled(100), **SETTINGS)
@given(route=st.sampled_from(_JSON_ROUTES), body=nested_json())
def test_json_of_any_depth_is_refused_cleanly(connection: httplib.HTTPConnection, route: str, body: bytes) -> None:
    status, payload, _ = post(connection, route, body, {"Content-Type": "application/json"})
    assert status < 500, (status, payload[:300])  # shallow valid JSON may well be answered
    if body.count(b"[") + body.count(b"{") > 128:  # every opener precedes every closer: that is the depth
        assert (status, json.loads(payload)["error"]) == (400, DEEP_ERROR), payload[:300]
    elif status != 200:
        assert json.loads(payload)["error"], payload[:300]


def _grpc_allowed(error: grpc.RpcError, raw: bool) -> bool:
    code = error.code()
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND):
        return bool(error.details())
    # grpcio refuses bytes that do not parse as the request message before our servicer runs.
    return raw and code == grpc.StatusCode.UNKNOWN and "Error parsing message" in (error.details() or "")


@settings(max_examples=scaled(300), **SETTINGS)
@given(case=grpc_request())
def test_grpc_infer_answers_or_refuses(channel: grpc.Channel, case: GrpcCase) -> None:
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    try:
        response = stub.ModelInfer(case.request, timeout=TIMEOUT)
    except grpc.RpcError as error:
        assert case.kind != "valid", (error.code(), error.details(), case.request)
        assert _grpc_allowed(error, raw=False), (error.code(), error.details(), case.request)
        return
    assert response.model_name == case.request.model_name
    assert len(response.raw_output_contents) == len(response.outputs) > 0


@settings(max_examples=scaled(150), **SETTINGS)
@given(data=grpc_bytes())
def test_grpc_wire_bytes_answer_or_refuse(channel: grpc.Channel, data: bytes) -> None:
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    try:
        reply = call(data, timeout=TIMEOUT)
    except grpc.RpcError as error:
        assert _grpc_allowed(error, raw=True), (error.code(), error.details(), data)
        return
    assert service_pb2.ModelInferResponse.FromString(reply).outputs


def check_still_serving(backend: Backend) -> None:
    """Every model answers correctly, no stub restarted or holds a request, the log is clean."""
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        data = np.arange(4, dtype=np.float32)
        inputs = [grpcclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(data)
        assert client.infer("add_sub", inputs, client_timeout=TIMEOUT).as_numpy("OUTPUT0").tolist() == [0, 2, 4, 6]
        tensor = grpcclient.InferInput("INPUT0", [2, 2], "FP32")
        tensor.set_data_from_numpy(data.reshape(2, 2))
        for model in ("identity_2d", "identity_fp32"):
            assert client.infer(model, [tensor], client_timeout=TIMEOUT).as_numpy("OUTPUT0").tolist() == \
                data.reshape(2, 2).tolist()
        strings = grpcclient.InferInput("INPUT0", [2], "BYTES")
        strings.set_data_from_numpy(np.array([b"a", b"\xff"], dtype=np.object_))
        assert client.infer("string_identity", [strings]).as_numpy("OUTPUT0").tolist() == [b"a", b"\xff"]
    finally:
        client.close()
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/pystub/stubs", timeout=TIMEOUT) as response:
        stubs = json.loads(response.read())["stubs"]
    assert len(stubs) == len(MODELS)
    assert all(row["healthy"] and row["restarts"] == 0 and row["in_flight"] == 0 for row in stubs), stubs
    log = backend.log()
    unexpected = [line for line in log.splitlines() if any(mark in line for mark in UNEXPECTED_LOG)]
    assert not unexpected, "\n".join(unexpected[:20])
